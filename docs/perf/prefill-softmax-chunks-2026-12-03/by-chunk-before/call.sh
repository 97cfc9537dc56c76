# prefill attention by chunk size (2048 .. the whole prompt) for prefill_kernel
# sync / K-V apart / ring, beside flash_kernel and PyTorch SDPA (the kernels' CUDA source logged
# in the same run: ptxas registers, SASS opcode histograms); time to first token at B=1 by chunk
set -o pipefail
D=.device
. $D/gpu_mem.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/machine.txt
printf '[compilation.logger]\nlevel = "full"\nfile = "/tmp/cubecl-src.log"\n' > cubecl.toml
timeout 230 $D/dustin-kernels-gpu prefill --json $OUT/prefill.jsonl > $OUT/prefill.txt 2>&1; echo "prefill rc=$?"
rm -f cubecl.toml
python3 - <<'PY'
import json
for l in open("/root/out/prefill.jsonl" if False else __import__("os").environ["OUT"] + "/prefill.jsonl"):
    try: r = json.loads(l)
    except Exception: continue
    if r.get("op") == "prefill-attention-chunked" and r.get("path") != "plain":
        print(r["n"], r.get("chunk"), r["path"], r.get("tflops"), r.get("error", ""))
PY
PYTHONUNBUFFERED=1 timeout 90 python3 $D/gemm_prefill_bench.py --sdpa-only 2>&1 | tee $OUT/torch.jsonl | tail -3
python3 $D/split_src.py /tmp/cubecl-src.log $OUT/src
export PATH=/usr/local/cuda/bin:$PATH
for f in $OUT/src/prefill_kernel*_[0-3].cu $OUT/src/flash_kernel*_[0-1].cu; do
  [ -f "$f" ] || continue
  b=${f%.cu}
  ( timeout 150 nvcc -cubin -arch=sm_90a -lineinfo -Xptxas -v -o $b.cubin $f > $b.ptxas.txt 2>&1
    cuobjdump -sass $b.cubin > $b.sass 2>/dev/null; python3 $D/sass_hist.py $b.sass > $b.hist.txt; rm -f $b.cubin ) &
done
wait
for f in $OUT/src/*.hist.txt; do b=${f%.hist.txt}; echo "== $b"; grep -E "kv_apart|registers|spill" $b.ptxas.txt | head -3; head -20 $f | tr '\n' ' '; echo; done
(cd $OUT && tar czf src.tgz src && rm -rf src)
T=$D/configs/Qwen2.5-7B-Instruct.config.json
timeout 170 $D/dustin bench --device cuda --config $T --prompt-len 32768 --batch 1 --decode 4 --warmup 1 --chunk 2048,4096,8192,16384 --prefill-tiles 0,3 2>&1 | tee $OUT/ttft_b1.txt | grep -o '"chunk":[0-9]*\|"prefill_secs":[0-9.]*,"prefill_tiles":[0-9]' | paste - -
