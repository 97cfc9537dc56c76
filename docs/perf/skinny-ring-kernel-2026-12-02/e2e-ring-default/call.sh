set -u
D=.device
. $D/gpu_mem.sh
C=$D/configs
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/machine.txt
date +%s > $OUT/t0
timeout 120 ./$D/dustin-kernels-gpu check --op skinny > $OUT/check_skinny.txt 2>&1; echo "check rc=$?"; grep -E "FAIL|check:|rror|panic" $OUT/check_skinny.txt | head -20
el() { echo "after $(( $(date +%s) - $(cat $OUT/t0) )) s"; }
T72="--target $C/Qwen2.5-72B-Instruct.config.json --target-layers 20 --ctx 32768"
mkdir -p $OUT/sync
SYNC=1 LIMIT=150 OUT=$OUT/sync bash $D/gpu_e2e.sh run 72b_sync $T72 --batch 8,16 --modes ar,dense,dustin | grep -E "^\| (dense|dustin|ar)|peak|rror"
el
LIMIT=150 OUT=$OUT bash $D/gpu_e2e.sh run 72b $T72 --batch 8,16 --modes ar,dense,dustin | grep -E "^\| (dense|dustin|ar)|peak|rror"
el
LIMIT=130 OUT=$OUT bash $D/gpu_e2e.sh run 7b --target $C/Qwen2.5-7B-Instruct.config.json --ctx 32768 --batch 8,16 --modes ar,dense,dustin | grep -E "^\| (dense|dustin|ar)|peak|rror"
el
