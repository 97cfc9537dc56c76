# prefill_kernel (two m-tiles a warp) beside flash_kernel: check rows,
# attention alone with PyTorch SDPA in the same call, ncu on one launch of each
set -o pipefail
D=.device
. $D/gpu_mem.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/machine.txt
timeout 100 $D/dustin-kernels-gpu check --op prefill 2>&1 | tee $OUT/check_prefill.txt | grep -E "x2|FAIL|check:" | tail -30
timeout 200 $D/dustin-kernels-gpu prefill --json $OUT/prefill.jsonl > $OUT/prefill.txt 2>&1; grep -v plain $OUT/prefill.jsonl | cut -c1-220
PYTHONUNBUFFERED=1 timeout 90 python3 $D/gemm_prefill_bench.py --sdpa-only 2>&1 | tee $OUT/torch.jsonl | tail -5
for k in prefill_kernel flash_kernel; do
timeout 100 ncu --kernel-name regex:$k --launch-skip 12 --launch-count 1 \
    --section LaunchStats --section Occupancy --section WarpStateStats \
    --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section SpeedOfLight \
    $D/dustin-kernels-gpu prefill --quick > $OUT/ncu_$k.txt 2>&1
echo "ncu $k rc=$?"
grep -E "Registers Per|Achieved Occupancy|Theoretical Occupancy|Duration|Issue Slots Busy|Executed Ipc A|Compute \(SM\) Throughput|Memory Throughput|L1/TEX Hit|Shared Memory Configuration Size|Dynamic Shared|Local" $OUT/ncu_$k.txt | head -20
done
timeout 170 $D/dustin bench --device cuda --config $D/configs/Qwen2.5-7B-Instruct.config.json --prompt-len 32768 --batch 1 --decode 8 --warmup 2 --chunk 2048 --prefill-tiles 1,2,1,2 2>&1 | tee $OUT/ttft_b1.txt | tail -6
