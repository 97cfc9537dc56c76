# time to first token at 7B shapes, 32k, with the new defaults (chunks of
# 16384, prefill_kernel with a two-buffer ring from 8192 keys) against chunks of 2048, B=1 and
# B=8, beside HF transformers (generate of one token) on the same machine
set -o pipefail
D=.device
. $D/gpu_mem.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/machine.txt
T=$D/configs/Qwen2.5-7B-Instruct.config.json
mem_watch b1
timeout 120 $D/dustin bench --device cuda --config $T --prompt-len 32768 --batch 1 --decode 4 --warmup 1 --chunk 0,2048,0,2048 2>&1 | tee $OUT/ttft_b1.txt | grep -o '"chunk":[0-9]*\|"prefill_secs":[0-9.]*' | paste - -
echo "{\"group\":\"b1\",\"peak_mib\":$(mem_peak_max b1)}" | tee -a $OUT/mem.jsonl
mem_watch b8
timeout 200 $D/dustin bench --device cuda --config $T --prompt-len 32768 --batch 8 --decode 2 --warmup 1 --chunk 0,2048,0 2>&1 | tee $OUT/ttft_b8.txt | grep -o '"chunk":[0-9]*\|"prefill_secs":[0-9.]*' | paste - -
echo "{\"group\":\"b8\",\"peak_mib\":$(mem_peak_max b8)}" | tee -a $OUT/mem.jsonl
PYTHONUNBUFFERED=1 timeout 170 python3 $D/hf_e2e_bench.py $D/configs --quick --ttft 2>&1 | tee $OUT/hf_ttft.jsonl | tail -4
