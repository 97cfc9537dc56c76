# the prefill GEMMs of one input under one pair of device waits
# (prefill_linear_many): check; cuBLAS rows (together / each) beside PyTorch; TTFT at 32k
set -o pipefail
D=.device
. $D/gpu_mem.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/machine.txt
timeout 120 $D/dustin-kernels-gpu check --op elementwise 2>&1 | tee $OUT/check_elementwise.txt | grep -E "prefill_gemm|FAIL|check:" | tail -12
timeout 240 $D/dustin-kernels-gpu gemm --no-burn --json $OUT/gemm.jsonl > $OUT/gemm.txt 2>&1; echo "gemm rc=$?"
grep -v skinny $OUT/gemm.jsonl | grep -E '"m":(4096|16384|32768),' | grep -E 'k/v|q/o|gate/up|\+' | cut -c1-160
PYTHONUNBUFFERED=1 timeout 150 python3 $D/gemm_prefill_bench.py > $OUT/torch.jsonl 2>&1
grep -E '"m": (4096|16384|32768),' $OUT/torch.jsonl | grep -E 'k/v|q/o|gate/up|\+' | cut -c1-170
T=$D/configs/Qwen2.5-7B-Instruct.config.json
timeout 100 $D/dustin bench --device cuda --config $T --prompt-len 32768 --batch 1 --decode 4 --warmup 1 --chunk 0,0 > $OUT/ttft_b1.txt 2>&1
grep -o '"chunk":[0-9]*\|"prefill_secs":[0-9.]*' $OUT/ttft_b1.txt | paste - -
timeout 150 $D/dustin bench --device cuda --config $T --prompt-len 32768 --batch 8 --decode 2 --warmup 1 --chunk 0 > $OUT/ttft_b8.txt 2>&1
grep -o '"chunk":[0-9]*\|"prefill_secs":[0-9.]*' $OUT/ttft_b8.txt | paste - -
