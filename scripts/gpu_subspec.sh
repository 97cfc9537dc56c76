#!/usr/bin/env bash
# SubSpec (offloaded target, substitute draft) on the GPU machine, from the repository
# root with `.device` carried (staged by `cargo run --release -p xtask -- gpu-e2e`).
#   bash .device/gpu_subspec.sh        # Qwen2.5-7B at 8 GiB, then Qwen2.5-32B at 24 GiB
#   bash .device/gpu_subspec.sh 7b     # 7B only
#   bash .device/gpu_subspec.sh 32b-only
# Each (model, mode) is one process; nvidia-smi samples the GPU memory every 100 ms (peak in
# mem.jsonl). Env: OUT (results folder), TAU (mean acceptance length of the subspec rows,
# default 3.14: SmolLM2-135M's substitute draft at 4 bits, gamma 4; 3.47 with KV=target),
# KV (`own` or `target`: the draft on the target's KV cache), LIMIT (seconds per process),
# UPLOAD (host memory of the offloaded weights, `--upload`; default pinned at 7B: pageable
# copies run at 0.4 GB/s, minutes per row, docs/perf.md) and
# UPLOAD32 (default pinned at 32B, where a pageable forward pass takes 35-50 s). First,
# `dustin-bench upload-check` checks the page-locked copy bit for bit and times both copy paths
# (upload.txt, upload.jsonl); when it fails the pinned rows are skipped. ELEMENTWISE (`fused`,
# the default, or `plain`: `--elementwise`, which includes the substitutes' dequantization),
# SKINNY (`on`, the default, or `off`: `--skinny-gemm`), GROUPED (`on`, the default, or
# `off`: `--grouped-gemm`).
set -u -o pipefail
D=.device
C=$D/configs
OUT=${OUT:-/tmp/dustin-subspec}
mkdir -p "$OUT"
. "$D/gpu_mem.sh"
TAU=${TAU:-3.14}

one() {
    local name=$1
    shift
    mem_watch "$name"
    timeout "${LIMIT:-240}" "$D/dustin-bench" subspec --device cuda --json "$OUT/subspec.jsonl" \
        --accept "$TAU" --kv "${KV:-own}" --elementwise "${ELEMENTWISE:-fused}" --skinny-gemm "${SKINNY:-on}" --grouped-gemm "${GROUPED:-on}" "$@" 2>&1 | tee "$OUT/$name.txt"
    echo "{\"run\":\"$name\",\"peak_mib\":$(mem_peak_max "$name")}" | tee -a "$OUT/mem.jsonl"
}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/machine.txt"
UP7=${UPLOAD:-pinned}
UP32=${UPLOAD32:-pinned}
if ! timeout 120 "$D/dustin-bench" upload-check --device cuda --json "$OUT/upload.jsonl" 2>&1 | tee "$OUT/upload.txt"; then
    echo "page-locked upload check failed: pageable rows only" | tee -a "$OUT/upload.txt"
    UP7=pageable
    UP32=pageable
fi
if [ "${1:-all}" != 32b-only ]; then
    one 7b_ar --target "$C/Qwen2.5-7B-Instruct.config.json" --gpu-memory 8GiB --modes ar \
        --upload "$UP7"
    one 7b_subspec --target "$C/Qwen2.5-7B-Instruct.config.json" --gpu-memory 8GiB --modes subspec \
        --upload "$UP7"
fi
if [ "${1:-all}" != 7b ]; then
    # page-locked: 1.1 s (ar) and 2.9 s (subspec) an iteration, but building and pinning
    # take 60-190 s a process; one untimed iteration (autotuning: without it the first
    # 32B subspec run measured 11.6 s an iteration, docs/perf.md). LIMIT32 seconds each.
    LIMIT=${LIMIT32:-420} one 32b_ar --target "$C/Qwen2.5-32B-Instruct.config.json" \
        --gpu-memory 24GiB --modes ar --prefetch on --warmup 1 --iters 2 --upload "$UP32"
    LIMIT=${LIMIT32:-420} one 32b_subspec --target "$C/Qwen2.5-32B-Instruct.config.json" \
        --gpu-memory 24GiB --modes subspec --prefetch on --warmup 1 --iters 2 --upload "$UP32"
fi
