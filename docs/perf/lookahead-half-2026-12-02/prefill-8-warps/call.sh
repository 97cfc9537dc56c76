# flash prefill with 4 and 8 warps a block (check, attention alone with
# PyTorch SDPA in the same call, time to first token), and the skinny check after the
# split_counters / Finish refactor
set -o pipefail
D=.device
. $D/gpu_mem.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/machine.txt
timeout 100 $D/dustin-kernels-gpu check --op prefill 2>&1 | tee $OUT/check_prefill.txt | grep -E "prefill|FAIL|check:" | tail -30
timeout 150 $D/dustin-kernels-gpu prefill --json $OUT/prefill.jsonl > $OUT/prefill.txt 2>&1; tail -40 $OUT/prefill.txt
PYTHONUNBUFFERED=1 timeout 90 python3 $D/gemm_prefill_bench.py --sdpa-only 2>&1 | tee $OUT/torch.jsonl | tail -5
timeout 170 $D/dustin bench --device cuda --config $D/configs/Qwen2.5-7B-Instruct.config.json --prompt-len 32768 --batch 1 --decode 8 --warmup 2 --chunk 2048 --prefill-warps 4,8,4,8 2>&1 | tee $OUT/ttft_b1.txt | tail -6
timeout 120 $D/dustin-kernels-gpu check --op skinny 2>&1 | tee $OUT/check_skinny.txt | grep -E "FAIL|check:|results" | tail -5
