#!/usr/bin/env bash
# The first GPU benchmark: random-weight Qwen2.5-0.5B and -7B shapes in bf16 on the GPU,
# prefill 4k tokens and decode 128. Run on the device machine from the repo root with
# `.device` carried (built by `cargo run -p xtask -- stage-gpu`).
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
D=.device
. "$D/gpu_mem.sh"   # unpacks the staged binaries
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
for m in 0.5B 7B; do
  ./.device/dustin-bench bench --device cuda --config ".device/configs/Qwen2.5-$m-Instruct.config.json" \
    --prompt-len 4096 --decode 128 --warmup 8 2>&1 | tee -a "$OUT/bench.jsonl"
done
