# prefill_kernel with head runs sized by L2 and conditional rescaling
# (FlashAttention-4's slack): check; timing by run length and rescale rule beside SDPA; TTFT
# at the default chunk, B=1 and B=8
set -o pipefail
D=.device
. $D/gpu_mem.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/machine.txt
timeout 120 $D/dustin-kernels-gpu check --op prefill 2>&1 | tee $OUT/check_prefill.txt | grep -E "FAIL|check:" | tail -8
timeout 400 $D/dustin-kernels-gpu prefill --json $OUT/prefill.jsonl > $OUT/prefill.txt 2>&1; echo "prefill rc=$?"
python3 - <<'PY'
import json, os
for l in open(os.environ["OUT"] + "/prefill.jsonl"):
    try: r = json.loads(l)
    except Exception: continue
    if r.get("op") == "prefill-attention-chunked" and r.get("path") not in ("plain", "split"):
        print(r["n"], r.get("chunk"), r["path"], r.get("tflops"), r.get("error", ""))
PY
PYTHONUNBUFFERED=1 timeout 90 python3 $D/gemm_prefill_bench.py --sdpa-only 2>&1 | tee $OUT/torch.jsonl | tail -3
T=$D/configs/Qwen2.5-7B-Instruct.config.json
mem_watch b1
timeout 100 $D/dustin bench --device cuda --config $T --prompt-len 32768 --batch 1 --decode 4 --warmup 1 --chunk 0,0 2>&1 | tee $OUT/ttft_b1.txt | grep -o '"chunk":[0-9]*\|"prefill_secs":[0-9.]*' | paste - -
echo "{\"group\":\"b1\",\"peak_mib\":$(mem_peak_max b1)}" | tee -a $OUT/mem.jsonl
mem_watch b8
timeout 150 $D/dustin bench --device cuda --config $T --prompt-len 32768 --batch 8 --decode 2 --warmup 1 --chunk 0 2>&1 | tee $OUT/ttft_b8.txt | grep -o '"chunk":[0-9]*\|"prefill_secs":[0-9.]*' | paste - -
echo "{\"group\":\"b8\",\"peak_mib\":$(mem_peak_max b8)}" | tee -a $OUT/mem.jsonl
