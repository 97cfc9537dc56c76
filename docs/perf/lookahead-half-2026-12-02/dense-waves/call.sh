# dense attention's split waves (2 default, 4, 8) on the flash kernel:
# the dense check with 8 waves, bench --quick per setting (7B, 72B, the 0.5B draft; B 8,
# 32k), then end to end 7B 32k B 8 with the new lookahead default (half), waves 2 and 8
set -o pipefail
D=.device
C=$D/configs
. $D/gpu_mem.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/machine.txt
timeout 60 $D/dustin-kernels-gpu check --op dense --dense-waves 8 2>&1 | tee $OUT/check_dense_w8.txt | grep -E "FAIL|check:" | tail -5
for w in 2 8 4; do
  timeout 80 $D/dustin-kernels-gpu bench --quick --dense-waves $w --json $OUT/bench_w$w.jsonl 2>&1 | tee $OUT/bench_w$w.txt | grep "^| [0-9]" | sed "s/^/w$w /"
done
SYNC=1 LIMIT=220 OUT=$OUT bash $D/gpu_e2e.sh run 7b_dw --target $C/Qwen2.5-7B-Instruct.config.json --ctx 32768 --batch 8 --modes ar,dense,dustin --dense-waves 2,8 2>&1 | grep -v "^\s*$" | tail -14
