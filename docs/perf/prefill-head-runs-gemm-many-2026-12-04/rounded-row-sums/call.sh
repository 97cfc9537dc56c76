# prefill_kernel's row sums of the rounded (bf16) probabilities: check;
# 16k timing beside SDPA
set -o pipefail
D=.device
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/machine.txt
. $D/gpu_mem.sh
timeout 120 $D/dustin-kernels-gpu check --op prefill 2>&1 | tee $OUT/check_prefill.txt | grep -E "n512|FAIL|check:" | tail -24
timeout 120 $D/dustin-kernels-gpu prefill --quick --json $OUT/prefill.jsonl > $OUT/prefill.txt 2>&1; echo "prefill rc=$?"
grep -E '"chunk":(2048|16384),' $OUT/prefill.jsonl | grep -v plain | cut -c1-150
PYTHONUNBUFFERED=1 timeout 60 python3 $D/gemm_prefill_bench.py --sdpa-only --quick 2>&1 | tee $OUT/torch.jsonl | tail -1
