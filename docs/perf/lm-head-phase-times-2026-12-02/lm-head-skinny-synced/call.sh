set -u
D=.device
. $D/gpu_mem.sh
C=$D/configs
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/machine.txt
# LM head (and every decode projection): Burn's matmul vs our skinny GEMMs, one process
timeout 120 ./$D/dustin-kernels-gpu gemm --decode-only --json $OUT/gemm.jsonl 2>&1 | grep -E "lm_head|error" | tee $OUT/gemm_lmhead.txt
# end to end with the LM head on the skinny GEMM (ar rows: the accept-drop-ab run had 18.59 ms at 72B B8)
LIMIT=170 OUT=$OUT bash $D/gpu_e2e.sh run 72b_lmhead --target $C/Qwen2.5-72B-Instruct.config.json --target-layers 20 --ctx 32768 --batch 8 --modes ar,dense,dustin
LIMIT=130 OUT=$OUT bash $D/gpu_e2e.sh run 7b_lmhead --target $C/Qwen2.5-7B-Instruct.config.json --ctx 32768 --batch 8 --modes ar,dense,dustin
# true phase split (a device sync at the end of each phase)
mkdir -p $OUT/sync
SYNC=1 LIMIT=130 OUT=$OUT/sync bash $D/gpu_e2e.sh run 72b_sync --target $C/Qwen2.5-72B-Instruct.config.json --target-layers 20 --ctx 32768 --batch 8 --modes ar,dense,dustin
