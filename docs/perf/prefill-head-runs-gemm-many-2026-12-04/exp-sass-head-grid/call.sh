# exp variants' SASS (cuda headers); prefill check with the heads-first grid
# and the tensor-core row sums; prefill timing beside SDPA; TTFT at the default chunk
set -o pipefail
D=.device
. $D/gpu_mem.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/machine.txt
export PATH=/usr/local/cuda/bin:$PATH
nvcc --version | tail -2
nvcc -cubin -arch=sm_90a -o $OUT/exp.cubin $D/exp_probe.cu 2>&1 | tail -3; cuobjdump -sass $OUT/exp.cubin > $OUT/exp.sass; rm -f $OUT/exp.cubin
grep -n "h2exp\|hexp" -A22 /usr/local/cuda/include/cuda_bf16.hpp | head -120 > $OUT/bf16_hexp.txt
grep -c MUFU $OUT/exp.sass; grep -E "Function|MUFU|FSETP|FMUL|FFMA|F2FP|HFMA2|HMUL2|PRMT|SHF|IMAD" $OUT/exp.sass | sed 's@/\*[0-9a-f]*\*/@@; s/ \+/ /g' | head -80
timeout 120 $D/dustin-kernels-gpu check --op prefill 2>&1 | tee $OUT/check_prefill.txt | grep -E "x2|FAIL|check:" | tail -24
timeout 330 $D/dustin-kernels-gpu prefill --json $OUT/prefill.jsonl > $OUT/prefill.txt 2>&1; echo "prefill rc=$?"
python3 - <<'PY'
import json, os
for l in open(os.environ["OUT"] + "/prefill.jsonl"):
    try: r = json.loads(l)
    except Exception: continue
    if r.get("op") == "prefill-attention-chunked" and r.get("path") != "plain":
        print(r["n"], r.get("chunk"), r["path"], r.get("tflops"), r.get("error", ""))
PY
PYTHONUNBUFFERED=1 timeout 90 python3 $D/gemm_prefill_bench.py --sdpa-only 2>&1 | tee $OUT/torch.jsonl | tail -3
T=$D/configs/Qwen2.5-7B-Instruct.config.json
timeout 100 $D/dustin bench --device cuda --config $T --prompt-len 32768 --batch 1 --decode 4 --warmup 1 --chunk 0,2048,0 2>&1 | tee $OUT/ttft_b1.txt | grep -o '"chunk":[0-9]*\|"prefill_secs":[0-9.]*' | paste - -
