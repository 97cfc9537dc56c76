#!/usr/bin/env bash
# The Qwen2.5-Coder pair's shapes on the GPU, run on the GPU machine from the repository root
# with `.device` carried (staged by `cargo run --release -p xtask -- gpu-e2e`; add
# `dustin-kernels-gpu` with `xtask gpu-kernels`).
#
# The weights do not travel (1.6 GB against 64 MiB a run): the models are random at the exact
# shapes of Qwen2.5-Coder-1.5B-Instruct and Qwen2.5-Coder-0.5B-Instruct (the same as
# Qwen2.5-1.5B/0.5B-Instruct's configs). Every speculative mode replays the acceptance trace
# its selector recorded with the real weights on the CPU (`$D/acceptance-trace.jsonl`, the
# `results.jsonl` of `dustin eval acceptance` on code at 8k tokens, gamma 4, greedy, budgets
# 1/8 and 1/16; `dustin-bench e2e --accept-trace`), each sequence of a batch from its own
# offset (`--ragged-accept on`). Without that file the modes run under the mean acceptance
# lengths in ACC.
#
#   bash .device/gpu_pair.sh check  # kernel checks (both binaries), then the pair at 32k,
#                                   # B 1/8/16, every mode, budget 1/16 (2048)
#   bash .device/gpu_pair.sh rest   # 72B (20 layers) and 7B shapes with the 0.5B draft at 32k,
#                                   # B 8/16; HF transformers at the 1.5B's shapes; the pair at
#                                   # 32k with budget 1/8 with and without a draft budget, and
#                                   # at 8k (1/16); the kernels' GPU check, if staged
# Env: OUT (results folder, default /tmp/dustin-pair), LIMIT (seconds per group).
set -u
D=.device
C=$D/configs
export OUT=${OUT:-/tmp/dustin-pair}
mkdir -p "$OUT"
. "$D/gpu_mem.sh"
unpack "$D"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/machine.txt"
ACC="dense=3.50,dustin=3.50,streaming=2.95,quest=2.91,snapkv=3.56"
TRACE=()
if [ -e "$D/acceptance-trace.jsonl" ]; then
    TRACE=(--accept-trace "$D/acceptance-trace.jsonl")
    echo "acceptance: the trace in $D/acceptance-trace.jsonl" | tee -a "$OUT/machine.txt"
fi
T15=$C/Qwen2.5-1.5B-Instruct.config.json
export RAGGED=on
pair() {
    # pair NAME CTX BUDGET BATCHES MODES [e2e args...]
    local name=$1 ctx=$2 budget=$3 batches=$4 modes=$5
    shift 5
    bash "$D/gpu_e2e.sh" run "$name" --target "$T15" --ctx "$ctx" --batch "$batches" \
        --budget "$budget" --modes "$modes" --accept "$ACC" "${TRACE[@]}" "$@"
}
case "${1:-check}" in
check)
    if [ -e "$D/dustin-kernels-gpu" ]; then
        timeout 150 "$D/dustin-kernels-gpu" check > "$OUT/kernels_gpu_check.txt" 2>&1
        echo "dustin-kernels-gpu check rc=$? $(grep -ciE 'fail' "$OUT/kernels_gpu_check.txt") lines with fail"
        tail -3 "$OUT/kernels_gpu_check.txt"
    fi
    timeout 330 "$D/dustin-bench" kernel-check --device cuda > "$OUT/kernel_check.txt" 2>&1
    echo "dustin-bench kernel-check rc=$?"
    tail -4 "$OUT/kernel_check.txt"
    pair pair_32k_16 32768 2048 1,8,16 ar,dense,dustin,streaming,quest,snapkv
    ;;
rest)
    bash "$D/gpu_e2e.sh" run shapes_72b --target "$C/Qwen2.5-72B-Instruct.config.json" \
        --target-layers 20 --ctx 32768 --batch 8,16 --budget 2048 --modes ar,dense,dustin \
        --accept "$ACC" "${TRACE[@]}"
    bash "$D/gpu_e2e.sh" run shapes_7b --target "$C/Qwen2.5-7B-Instruct.config.json" \
        --ctx 32768 --batch 8,16 --budget 2048 --modes ar,dense,dustin --accept "$ACC" "${TRACE[@]}"
    PYTHONUNBUFFERED=1 timeout "${HF_LIMIT:-120}" python3 "$D/hf_e2e_bench.py" "$C" \
        --target=Qwen2.5-1.5B-Instruct --ctxs=32768 --batches=1,16 2>&1 | tee "$OUT/hf.jsonl"
    pair pair_32k_8 32768 4096 1,16 dense,dustin,streaming --draft-budget 0,2048
    pair pair_8k_16 8192 512 1,16 ar,dense,dustin,streaming,quest,snapkv
    if [ -e "$D/dustin-kernels-gpu" ]; then
        timeout 150 "$D/dustin-kernels-gpu" check > "$OUT/kernels_gpu_check.txt" 2>&1
        echo "dustin-kernels-gpu check rc=$? $(grep -ciE 'fail' "$OUT/kernels_gpu_check.txt") lines with fail"
        tail -3 "$OUT/kernels_gpu_check.txt"
    fi
    ;;
*)
    echo "usage: gpu_pair.sh check|rest" >&2
    exit 2
    ;;
esac
