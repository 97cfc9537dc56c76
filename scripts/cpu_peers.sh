#!/usr/bin/env bash
# Ours, HF transformers on PyTorch and llama.cpp, side by side on one prompt, on this
# machine's CPU.
#
#   scripts/cpu_peers.sh PROMPT_FILE [NEW_TOKENS] [PYTHON]
#
# Rows (each prints prefill and decode tokens/s):
#   dustin: the 1.5B alone with block weights, prefill through AMX where the CPU has it
#   dustin: the same with --quant-prefill off (each weight decoded for an f32 matmul)
#   dustin: the 0.5B drafting for the 1.5B (gamma 4, dense verification)
#   torch:  HF transformers, float32, SDPA, the same GGUF file (scripts/hf_cpu_bench.py)
#   llama.cpp, where its binaries are in LLAMA_CPP_DIR (default
#   target/llama.cpp/build/bin, built by scripts/build_llama_cpp.sh), the same GGUF files:
#     llama-bench on the 1.5B: a prefill of the prompt's length (its token count as dustin
#     reports it), then NEW_TOKENS decoded after that many tokens of context (LLAMA_REPS
#     runs each, default 3: mean +- deviation)
#     llama-speculative-simple: the 0.5B drafting for the 1.5B on the prompt file itself
#     (llama.cpp's own tokens), greedy, 4 tokens a draft (none cut for low probability),
#     NEW_TOKENS generated
# Needs a release build (cargo build --release -p dustin-cli), both models in the cache
# (dustin fetch-model; TARGET_GGUF and DRAFT_GGUF name other files for the llama.cpp rows)
# and, for the torch row, `pip install -r scripts/requirements.txt` in PYTHON's environment
# (default: python3). The llama.cpp rows run THREADS threads (default nproc: all cores, as
# the other rows use). Run with nothing else on the cores.
set -euo pipefail
prompt=${1:?usage: scripts/cpu_peers.sh PROMPT_FILE [NEW_TOKENS] [PYTHON]}
new=${2:-16}
py=${3:-python3}
bin=${DUSTIN_BIN:-target/release/dustin}
llama=${LLAMA_CPP_DIR:-target/llama.cpp/build/bin}
models=${DUSTIN_CACHE:-$HOME/.cache/dustin}/models
target=${TARGET_GGUF:-$models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf}
draft=${DRAFT_GGUF:-$models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf}
threads=${THREADS:-$(nproc)}
reps=${LLAMA_REPS:-3}
[ -x "$bin" ] || { echo "no $bin: cargo build --release -p dustin-cli" >&2; exit 1; }
line=
row() {
    local name=$1; shift
    line=$("$bin" generate --prompt-file "$prompt" --max-new-tokens "$new" "$@" 2>&1 >/dev/null | grep -E '^(prefill|speculative)' || true)
    echo "| $name | $line |"
}
# llama-bench's CSV: the mean and deviation (its last two columns) of one test.
bench() {
    "$llama/llama-bench" -m "$target" -t "$threads" -r "$reps" -o csv "$@" 2>/dev/null \
        | awk -F, 'NR == 2 { gsub(/"/, ""); printf "%.2f +- %.2f", $(NF - 1), $NF }'
}
echo "| row | result |"
echo "|---|---|"
row "dustin 1.5B, block weights" --model qwen2.5-coder-1.5b-instruct
n=$(echo "$line" | sed -n 's/^prefill: \([0-9][0-9]*\) tokens.*/\1/p')
row "dustin 1.5B, block weights, --quant-prefill off" --model qwen2.5-coder-1.5b-instruct --quant-prefill off
row "dustin 0.5B drafting for 1.5B, gamma 4" --model qwen2.5-coder-1.5b-instruct --draft qwen2.5-coder-0.5b-instruct
echo "| torch f32, HF transformers | $("$py" scripts/hf_cpu_bench.py --prompt-file "$prompt" --new-tokens "$new" 2>/dev/null) |"

if [ ! -x "$llama/llama-bench" ] || [ ! -x "$llama/llama-speculative-simple" ]; then
    echo "no llama.cpp binaries in $llama (scripts/build_llama_cpp.sh): its rows left out" >&2
    exit 0
fi
if [ -z "$n" ]; then
    echo "| llama.cpp 1.5B, llama-bench | no prompt length: dustin's first row printed none |"
else
    pp=$(bench -p "$n" -n 0) || pp=failed
    tg=$(bench -p 0 -n "$new" -d "$n") || tg=failed
    echo "| llama.cpp 1.5B, llama-bench | prefill: $n tokens, ${pp:-failed} tokens/s; decode: $new tokens after $n, ${tg:-failed} tokens/s ($reps runs) |"
fi
ctx=$(( ${n:-4096} + new + 256 ))
spec=$("$llama/llama-speculative-simple" -m "$target" -md "$draft" --spec-type draft-simple \
    --spec-draft-n-max 4 --spec-draft-n-min 0 --draft-p-min 0 --temp 0 --top-k 1 \
    -f "$prompt" -n "$new" --ignore-eos -c "$ctx" -b "$ctx" -t "$threads" -td "$threads" \
    2>&1 >/dev/null || true)
field() { echo "$spec" | sed -n "s/.* I $1 *= *\([0-9.%]*\)\$/\1/p" | tail -1; }
enc=$(echo "$spec" | sed -n 's/.* I encoded *\([0-9]*\) tokens in *\([0-9.]*\) seconds.*/\1 tokens in \2 s/p')
dec=$(echo "$spec" | sed -n 's/.* I decoded *\([0-9]*\) tokens in *\([0-9.]*\) seconds, speed: *\([0-9.]*\) t\/s/\1 tokens in \2 s (\3 tokens\/s)/p')
if [ -n "$dec" ]; then
    echo "| llama.cpp 0.5B drafting for 1.5B, 4 a draft | prefill (both models): $enc; decode: $dec; accepted $(field n_accept) of $(field n_drafted) drafted ($(field accept)) |"
else
    echo "| llama.cpp 0.5B drafting for 1.5B, 4 a draft | failed: $(echo "$spec" | grep -E ' E ' | tail -1) |"
fi
