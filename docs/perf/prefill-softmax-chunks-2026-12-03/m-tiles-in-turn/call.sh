# prefill_kernel with each m-tile's softmax, rescale and P V in turn
# (interleave) against the default order, checked and timed side by side; SDPA
set -o pipefail
D=.device
. $D/gpu_mem.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/machine.txt
timeout 100 $D/dustin-kernels-gpu check --op prefill 2>&1 | tee $OUT/check_prefill.txt | grep -E " il|FAIL|check:" | tail -10
timeout 200 $D/dustin-kernels-gpu prefill --json $OUT/prefill.jsonl > $OUT/prefill.txt 2>&1; echo "prefill rc=$?"
python3 - <<'PY'
import json, os
for l in open(os.environ["OUT"] + "/prefill.jsonl"):
    try: r = json.loads(l)
    except Exception: continue
    if r.get("op") == "prefill-attention-chunked" and r.get("path") != "plain":
        print(r["n"], r.get("chunk"), r["path"], r.get("tflops"), r.get("error", ""))
PY
PYTHONUNBUFFERED=1 timeout 90 python3 $D/gemm_prefill_bench.py --sdpa-only 2>&1 | tee $OUT/torch.jsonl | tail -3
