set -u
D=.device
. $D/gpu_mem.sh
C=$D/configs
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/machine.txt
timeout 150 ./$D/dustin-kernels-gpu check --op elementwise > $OUT/check_elementwise.txt 2>&1
grep -E "FAIL|check:" $OUT/check_elementwise.txt | tail -12
timeout 200 ./$D/dustin-kernels-gpu gemm --decode-only --json $OUT/gemm.jsonl > $OUT/gemm.txt 2>&1
echo "gemm rc=$? rows $(wc -l < $OUT/gemm.jsonl)"
LIMIT=170 OUT=$OUT bash $D/gpu_e2e.sh run 72b --target $C/Qwen2.5-72B-Instruct.config.json --target-layers 20 --ctx 32768 --batch 8,16 --modes ar,dense,dustin
SKMMA=mma LIMIT=110 OUT=$OUT bash $D/gpu_e2e.sh run 72b_b16_mma --target $C/Qwen2.5-72B-Instruct.config.json --target-layers 20 --ctx 32768 --batch 16 --modes dense,dustin
LIMIT=100 OUT=$OUT bash $D/gpu_e2e.sh run 7b --target $C/Qwen2.5-7B-Instruct.config.json --ctx 32768 --batch 8 --modes ar,dense,dustin
