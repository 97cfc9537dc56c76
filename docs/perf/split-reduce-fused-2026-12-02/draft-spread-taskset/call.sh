set -u
D=.device
. $D/gpu_mem.sh
C=$D/configs
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/machine.txt
lscpu | head -25 > $OUT/lscpu.txt; lscpu -e > $OUT/lscpu_e.txt 2>&1; cat $OUT/lscpu.txt | grep -E "^CPU\(s\)|Thread|Core|Socket|NUMA|Model name|MHz"
head -20 $OUT/lscpu_e.txt
date +%s > $OUT/t0
el() { echo "after $(( $(date +%s) - $(cat $OUT/t0) )) s"; }
A="--target $C/Qwen2.5-7B-Instruct.config.json --target-layers 2 --ctx 32768 --batch 8 --modes dense"
run() { local tag=$1; shift; mkdir -p $OUT/$tag; SYNC=1 WARMUP=2 ITERS=8 LIMIT=60 OUT=$OUT/$tag BIN="$1" bash $D/gpu_e2e.sh run $tag $A | grep -E "^\| (dense|dustin|ar)|rror"; el; }
run def1 $D/dustin
run def2 $D/dustin
run def3 $D/dustin
cat > $OUT/pin.sh <<'EOP'
#!/usr/bin/env bash
exec taskset -c "$PIN" .device/dustin "$@"
EOP
chmod +x $OUT/pin.sh
export PIN=2,3; run pin23a $OUT/pin.sh
export PIN=2,3; run pin23b $OUT/pin.sh
export PIN=2,10; run pin210a $OUT/pin.sh
export PIN=2,10; run pin210b $OUT/pin.sh
