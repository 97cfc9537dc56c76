# prefill_kernel with the scale folded into one fma before exp, max by fmaxf
# and the causal mask branched over outside the diagonal: check, timing by chunk beside SDPA,
# ptxas/SASS of the new kernel; time to first token at B=8 by chunk, B=1 at 2048 and 16384
set -o pipefail
D=.device
. $D/gpu_mem.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/machine.txt
timeout 100 $D/dustin-kernels-gpu check --op prefill 2>&1 | tee $OUT/check_prefill.txt | grep -E "x2|FAIL|check:" | tail -16
printf '[compilation.logger]\nlevel = "full"\nfile = "/tmp/cubecl-src.log"\n' > cubecl.toml
timeout 230 $D/dustin-kernels-gpu prefill --json $OUT/prefill.jsonl > $OUT/prefill.txt 2>&1; echo "prefill rc=$?"
rm -f cubecl.toml
python3 - <<'PY'
import json, os
for l in open(os.environ["OUT"] + "/prefill.jsonl"):
    try: r = json.loads(l)
    except Exception: continue
    if r.get("op") == "prefill-attention-chunked" and r.get("path") != "plain":
        print(r["n"], r.get("chunk"), r["path"], r.get("tflops"), r.get("error", ""))
PY
PYTHONUNBUFFERED=1 timeout 90 python3 $D/gemm_prefill_bench.py --sdpa-only 2>&1 | tee $OUT/torch.jsonl | tail -3
python3 $D/split_src.py /tmp/cubecl-src.log $OUT/src
export PATH=/usr/local/cuda/bin:$PATH
for f in $OUT/src/prefill_kernel*_[0-2].cu $OUT/src/flash_kernel*_0.cu; do
  [ -f "$f" ] || continue
  b=${f%.cu}
  sed -i 's/^typedef unsigned long long int uint64;/typedef unsigned long int uint64;/; s/^typedef signed long long int int64;/typedef signed long int int64;/' $f
  ( timeout 200 nvcc -cubin -arch=sm_90a -lineinfo -Xptxas -v -o $b.cubin $f > $b.ptxas.txt 2>&1
    cuobjdump -sass $b.cubin > $b.sass 2>/dev/null; python3 $D/sass_hist.py $b.sass > $b.hist.txt; rm -f $b.cubin ) &
done
wait
for f in $OUT/src/*.hist.txt; do b=${f%.hist.txt}; echo "== $b"; grep -E "error|registers|spill" $b.ptxas.txt | head -3; head -16 $f | tr '\n' ' '; echo; done
(cd $OUT && tar czf src.tgz src && rm -rf src)
T=$D/configs/Qwen2.5-7B-Instruct.config.json
timeout 200 $D/dustin bench --device cuda --config $T --prompt-len 32768 --batch 8 --decode 2 --warmup 1 --chunk 2048,4096,8192 2>&1 | tee $OUT/ttft_b8.txt | grep -o '"chunk":[0-9]*\|"prefill_secs":[0-9.]*,"prefill_tiles":[0-9]' | paste - -
timeout 100 $D/dustin bench --device cuda --config $T --prompt-len 32768 --batch 1 --decode 4 --warmup 1 --chunk 2048,16384 2>&1 | tee $OUT/ttft_b1.txt | grep -o '"chunk":[0-9]*\|"prefill_secs":[0-9.]*,"prefill_tiles":[0-9]' | paste - -
