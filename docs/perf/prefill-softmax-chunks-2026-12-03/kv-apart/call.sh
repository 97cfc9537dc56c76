# prefill_kernel with K and V staged apart (tiles 3) checked and timed beside
# the default, PyTorch SDPA; the kernels' generated CUDA source, ptxas registers and SASS
# opcode histograms; time to first token flash_kernel (1) / automatic (0) / K-V apart (3)
set -o pipefail
D=.device
. $D/gpu_mem.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/machine.txt
timeout 100 $D/dustin-kernels-gpu check --op prefill 2>&1 | tee $OUT/check_prefill.txt | grep -E "x2|FAIL|check:" | tail -30
timeout 200 $D/dustin-kernels-gpu prefill --json $OUT/prefill.jsonl > $OUT/prefill.txt 2>&1; echo "prefill rc=$?"; grep -v plain $OUT/prefill.jsonl | cut -c1-200
PYTHONUNBUFFERED=1 timeout 90 python3 $D/gemm_prefill_bench.py --sdpa-only 2>&1 | tee $OUT/torch.jsonl | tail -5
printf '[compilation.logger]\nlevel = "full"\nfile = "/tmp/cubecl-src.log"\n' > cubecl.toml
timeout 120 $D/dustin-kernels-gpu check --op prefill > $OUT/check_src_run.txt 2>&1; echo "src run rc=$?"
rm -f cubecl.toml
ls -la /tmp/cubecl-src.log
python3 $D/split_src.py /tmp/cubecl-src.log $OUT/src
export PATH=/usr/local/cuda/bin:$PATH
for f in $OUT/src/prefill_kernel_[0-4].cu $OUT/src/flash_kernel_[0-2].cu; do
  [ -f "$f" ] || continue
  b=${f%.cu}
  ( timeout 150 nvcc -cubin -arch=sm_90a -lineinfo -Xptxas -v -o $b.cubin $f > $b.ptxas.txt 2>&1
    cuobjdump -sass $b.cubin > $b.sass 2>/dev/null; python3 $D/sass_hist.py $b.sass > $b.hist.txt; rm -f $b.cubin ) &
done
wait
for f in $OUT/src/*.hist.txt; do b=${f%.hist.txt}; echo "== $b"; grep -E "registers|spill" $b.ptxas.txt | head -3; head -24 $f | tr '\n' ' '; echo; done
gzip -f $OUT/src/*.sass 2>/dev/null
T=$D/configs/Qwen2.5-7B-Instruct.config.json
timeout 150 $D/dustin bench --device cuda --config $T --prompt-len 32768 --batch 1 --decode 4 --warmup 1 --chunk 2048 --prefill-tiles 1,0,3,1,0,3 2>&1 | tee $OUT/ttft_b1.txt | grep -o '"prefill_secs":[0-9.]*,"prefill_tiles":[0-9]'
