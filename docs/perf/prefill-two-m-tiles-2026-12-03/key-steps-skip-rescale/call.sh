# prefill_kernel in compute steps of 64 and 32 keys (the rescale skipped
# where no maximum moved), with and without cp.async, beside flash_kernel and PyTorch SDPA
set -o pipefail
D=.device
. $D/gpu_mem.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/machine.txt
timeout 100 $D/dustin-kernels-gpu check --op prefill 2>&1 | tee $OUT/check_prefill.txt | grep -E "x2|FAIL|check:" | tail -30
timeout 220 $D/dustin-kernels-gpu prefill --json $OUT/prefill.jsonl > $OUT/prefill.txt 2>&1; grep -v plain $OUT/prefill.jsonl | cut -c1-200
PYTHONUNBUFFERED=1 timeout 90 python3 $D/gemm_prefill_bench.py --sdpa-only 2>&1 | tee $OUT/torch.jsonl | tail -5
timeout 100 ncu --kernel-name regex:prefill_kernel --launch-skip 10 --launch-count 1 \
    --section LaunchStats --section Occupancy --section WarpStateStats \
    --section ComputeWorkloadAnalysis --section SpeedOfLight \
    $D/dustin-kernels-gpu prefill --quick > $OUT/ncu_prefill_kernel.txt 2>&1
grep -E "Registers Per|Achieved Occupancy|Duration|Issue Slots Busy|Local Memory Spilling Requests " $OUT/ncu_prefill_kernel.txt | head
