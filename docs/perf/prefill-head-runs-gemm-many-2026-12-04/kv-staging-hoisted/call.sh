# prefill_kernel's K/V staging with per-thread offsets hoisted, K and V
# staged apart as the automatic choice, head runs of one KV head's query heads: check;
# timing twice beside SDPA; TTFT at the default chunk, B=1 and B=8
set -o pipefail
D=.device
. $D/gpu_mem.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/machine.txt
timeout 120 $D/dustin-kernels-gpu check --op prefill 2>&1 | tee $OUT/check_prefill.txt | grep -E "FAIL|check:" | tail -8
for r in 1 2; do
timeout 300 $D/dustin-kernels-gpu prefill --json $OUT/prefill$r.jsonl > $OUT/prefill$r.txt 2>&1; echo "prefill rc=$?"
done
python3 - <<'PY'
import json, os
rows = {}
for r in (1, 2):
    for l in open(os.environ["OUT"] + f"/prefill{r}.jsonl"):
        try: x = json.loads(l)
        except Exception: continue
        if x.get("op") == "prefill-attention-chunked" and x.get("path") not in ("plain", "split"):
            rows.setdefault((x["n"], x.get("chunk"), x["path"]), []).append(x.get("tflops"))
for k, v in rows.items():
    print(*k, *v)
PY
PYTHONUNBUFFERED=1 timeout 90 python3 $D/gemm_prefill_bench.py --sdpa-only 2>&1 | tee $OUT/torch.jsonl | tail -3
T=$D/configs/Qwen2.5-7B-Instruct.config.json
mem_watch b1
timeout 100 $D/dustin bench --device cuda --config $T --prompt-len 32768 --batch 1 --decode 4 --warmup 1 --chunk 0,0 > $OUT/ttft_b1.txt 2>&1
grep -o '"chunk":[0-9]*\|"prefill_secs":[0-9.]*' $OUT/ttft_b1.txt | paste - -
echo "{\"group\":\"b1\",\"peak_mib\":$(mem_peak_max b1)}" | tee -a $OUT/mem.jsonl
mem_watch b8
timeout 150 $D/dustin bench --device cuda --config $T --prompt-len 32768 --batch 8 --decode 2 --warmup 1 --chunk 0 > $OUT/ttft_b8.txt 2>&1
grep -o '"chunk":[0-9]*\|"prefill_secs":[0-9.]*' $OUT/ttft_b8.txt | paste - -
echo "{\"group\":\"b8\",\"peak_mib\":$(mem_peak_max b8)}" | tee -a $OUT/mem.jsonl
rm -f $OUT/mem_b1.txt $OUT/mem_b8.txt
