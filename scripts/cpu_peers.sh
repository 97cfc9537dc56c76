#!/usr/bin/env bash
# Ours and HF transformers on PyTorch, side by side on one prompt, on this machine's CPU.
#
#   scripts/cpu_peers.sh PROMPT_FILE [NEW_TOKENS] [PYTHON]
#
# Rows (each prints prefill and decode tokens/s):
#   dustin: the 1.5B alone with block weights, prefill through AMX where the CPU has it
#   dustin: the same with --quant-prefill off (each weight decoded for an f32 matmul)
#   dustin: the 0.5B drafting for the 1.5B (gamma 4, dense verification)
#   torch:  HF transformers, float32, SDPA, the same GGUF file (scripts/hf_cpu_bench.py)
# Needs a release build (cargo build --release -p dustin-cli), both models in the cache
# (dustin fetch-model) and, for the torch row, `pip install -r scripts/requirements.txt`
# in PYTHON's environment (default: python3). Run with nothing else on the cores.
set -euo pipefail
prompt=${1:?usage: scripts/cpu_peers.sh PROMPT_FILE [NEW_TOKENS] [PYTHON]}
new=${2:-16}
py=${3:-python3}
bin=${DUSTIN_BIN:-target/release/dustin}
[ -x "$bin" ] || { echo "no $bin: cargo build --release -p dustin-cli" >&2; exit 1; }
row() {
    local name=$1; shift
    local line
    line=$("$bin" generate --prompt-file "$prompt" --max-new-tokens "$new" "$@" 2>&1 >/dev/null | grep -E '^(prefill|speculative)' || true)
    echo "| $name | $line |"
}
echo "| row | result |"
echo "|---|---|"
row "dustin 1.5B, block weights" --model qwen2.5-coder-1.5b-instruct
row "dustin 1.5B, block weights, --quant-prefill off" --model qwen2.5-coder-1.5b-instruct --quant-prefill off
row "dustin 0.5B drafting for 1.5B, gamma 4" --model qwen2.5-coder-1.5b-instruct --draft qwen2.5-coder-0.5b-instruct
echo "| torch f32, HF transformers | $("$py" scripts/hf_cpu_bench.py --prompt-file "$prompt" --new-tokens "$new" 2>/dev/null) |"
