# prefill check with head runs of 14 (two KV heads) and 2 (under a group);
# the 7B prefill GEMM rows twice, in two processes (is the 4096-row q/o time a warm-up effect?)
set -o pipefail
D=.device
. $D/gpu_mem.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/machine.txt
timeout 120 $D/dustin-kernels-gpu check --op prefill 2>&1 | tee $OUT/check_prefill.txt | grep -E "run|FAIL|check:" | tail -10
for r in 1 2; do
timeout 150 $D/dustin-kernels-gpu gemm --no-burn --model 7B --json $OUT/gemm$r.jsonl > $OUT/gemm$r.txt 2>&1; echo "gemm rc=$?"
grep -v skinny $OUT/gemm$r.jsonl | grep -E '"m":(4096|16384),' | grep -E 'k/v|q/o|\+' | cut -c1-120
done
