# time to first token, 7B shapes, 32k, chunks of 2048, flash_kernel (1)
# against the automatic choice (0: prefill_kernel, one buffer), alternated
set -o pipefail
D=.device
. $D/gpu_mem.sh
T=$D/configs/Qwen2.5-7B-Instruct.config.json
timeout 150 $D/dustin bench --device cuda --config $T --prompt-len 32768 --batch 1 --decode 4 --warmup 1 --chunk 2048 --prefill-tiles 1,0,1,0 2>&1 | tee $OUT/ttft_b1.txt | grep -o '"prefill_secs":[0-9.]*,"prefill_tiles":[0-9]'
timeout 200 $D/dustin bench --device cuda --config $T --prompt-len 32768 --batch 8 --decode 2 --warmup 1 --chunk 2048 --prefill-tiles 1,0 2>&1 | tee $OUT/ttft_b8.txt | grep -o '"prefill_secs":[0-9.]*,"prefill_tiles":[0-9]'
