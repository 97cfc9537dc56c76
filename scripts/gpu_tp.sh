#!/usr/bin/env bash
# Tensor parallelism on a machine with 2 or more GPUs, from the repository root
# with `.device` carried (staged by `cargo run --release -p xtask -- gpu-e2e`).
#   bash .device/gpu_tp.sh check   # tp-check: Qwen2.5-72B shapes, first 4 layers, split over
#                                  # TP GPUs vs whole on GPU 0, f32 and bf16
#   bash .device/gpu_tp.sh bench   # `dustin-bench e2e --tp TP`: Qwen2.5-72B, all 80 layers, 0.5B draft
#                                  # replicated, 32k context, batch BATCH, modes MODES
#   bash .device/gpu_tp.sh all     # both
#   bash .device/gpu_tp.sh diagnose  # tp-check with the device all-reduce and the device copy
#                                    # each swapped for the host path (which part is wrong)
# Env: OUT (results folder), TP (ranks, default 2), BATCH (default 8), CTX (default 32768),
# MODES (default ar,dustin,dense; one process each), TAU (mean acceptance length of the
# speculative modes, default 1.36: dense and dustin on SmolLM2 at 4096 tokens,
# docs/fidelity.md), LIMIT (seconds per bench process), CHECK_LIMIT (seconds per check).
# NCCL's NVLink multicast stays off (NCCL_NVLS_ENABLE=0). nvidia-smi samples every GPU's
# memory every 100 ms (peak per GPU in mem.jsonl). DTYPES (checks, default "f32 bf16"),
# PROFILE (non-empty: `e2e --profile`, phase times per mode, slower runs).
# CHECK_BATCH / CHECK_CTX / CHECK_STEPS (default 2 / 32 / 4). A fresh machine spends about 60 s
# of the first check autotuning; CHECK_LIMIT defaults to 240 s.
set -u
D=.device
C=$D/configs
OUT=${OUT:-/tmp/dustin-tp}
mkdir -p "$OUT"
. "$D/gpu_mem.sh"
export NCCL_NVLS_ENABLE=0
TP=${TP:-2}

nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader | tee "$OUT/machine.txt"
nvidia-smi topo -m 2>&1 | head -8 | tee "$OUT/topo.txt"
case "${1:-all}" in
diagnose)
    # which CUDA piece differs from the CPU path: NCCL's all-reduce (--host-sum) or the shards'
    # device-to-device copy (--host-copy); bf16, 72B shapes, 4 layers, one small batch each
    for flags in "" "--host-sum" "--host-copy" "--host-sum --host-copy"; do
        echo "== tp-check $flags"
        # shellcheck disable=SC2086
        timeout "${CHECK_LIMIT:-200}" "$D/dustin-bench" tp-check --device cuda --dtype bf16 --tp "$TP" \
            --target "$C/Qwen2.5-72B-Instruct.config.json" --target-layers 4 --batch 1 --ctx 16 \
            --steps 3 $flags 2>&1 | grep -E "^tp-check|^error" | tee -a "$OUT/diagnose.txt"
    done
    ;;
check | all)
    for dt in ${DTYPES:-f32 bf16}; do
        mem_watch "check_$dt"
        timeout "${CHECK_LIMIT:-240}" "$D/dustin-bench" tp-check --device cuda --dtype "$dt" --tp "$TP" \
            --target "$C/Qwen2.5-72B-Instruct.config.json" --target-layers 4 --batch "${CHECK_BATCH:-2}" \
            --ctx "${CHECK_CTX:-32}" --steps "${CHECK_STEPS:-4}" 2>&1 | tee "$OUT/check_$dt.txt"
        echo "{\"run\":\"check_$dt\",\"peak_mib_per_gpu\":\"$(mem_peak "check_$dt")\"}" | tee -a "$OUT/mem.jsonl"
    done
    ;;&
bench | all)
    # one process per mode: the allocator's pools of one mode do not crowd the next (at 72B,
    # 32k, batch 8 a GPU holds 75 GB of weights and 43 GB of KV)
    for mode in $(echo "${MODES:-ar,dustin,dense}" | tr , ' '); do
        mem_watch "bench_$mode"
        timeout "${LIMIT:-200}" "$D/dustin-bench" e2e --device cuda --tp "$TP" --json "$OUT/e2e.jsonl" \
            --target "$C/Qwen2.5-72B-Instruct.config.json" --draft "$C/Qwen2.5-0.5B-Instruct.config.json" \
            --ctx "${CTX:-32768}" --batch "${BATCH:-8}" --modes "$mode" \
            --accept "default=${TAU:-1.36}" --warmup 2 --iters 6 ${PROFILE:+--profile} 2>&1 | grep -v "^\s*$" | tail -40 | tee "$OUT/bench_$mode.txt"
        echo "{\"run\":\"bench_$mode\",\"peak_mib_per_gpu\":\"$(mem_peak "bench_$mode")\"}" | tee -a "$OUT/mem.jsonl"
    done
    ;;
esac
