#!/usr/bin/env bash
# The real Qwen2.5-Coder pair on the GPU machine: its GGUF files (1.6 GB) travel in parts over
# back-to-back device runs (64 MiB a run), while a background job uses the GPU for the runs
# that need no weights; once the files are whole, the same job runs the evaluations with the
# real weights. Run from the repository root with `.device` carried; the parts come from
# `scripts/gpu_real_pair.sh split` here.
#
#   bash scripts/gpu_real_pair.sh split        # (here) cut the cached GGUF files into .w/
#   bash .device/gpu_real_pair.sh start        # unpack, start the background job
#   bash .device/gpu_real_pair.sh part NAME    # move the carried .w/NAME into place
#   bash .device/gpu_real_pair.sh parallel     # start the other evaluations beside the job
#   bash .device/gpu_real_pair.sh poll [SECS]  # wait up to SECS, copy the results to $OUT
#
# The background job, in order (each step's output in $R/<step>; the log in $R/job.log):
#   1. random weights at the pair's and (on a card of more than 100 GB) Qwen2.5-72B's shapes
#      under the recorded acceptance trace, one process per (batch, mode) so that each mode's
#      peak GPU memory is its own (SHAPES=0 skips this step);
#   2. the real pair, once every part is in place (sha256 checked):
#      `dustin eval fidelity` on code and on PG-19 at 4096 and 8192 tokens (>= 1000 verified
#      positions per cell) with `eval pg19`'s perplexity report, our decoding beside HF
#      transformers `generate` and assisted generation on the same prompts (batch 1), then
#      `dustin eval longbench` (5 samples per task).
set -u
D=.device
R=${R:-/root/dustin-real}
W=/root/.cache/dustin/models
T=qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
DR=qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
T_SHA=cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046
DR_SHA=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
PART=57000000
T_PARTS=20
DR_PARTS=9
# every selector of the fidelity tables, and the paper's reuse beside re-ranking
SEL='dense,streaming,h2o,snapkv,quest,oracle,draft-only,history-only,dustin,pyramid(dustin),reuse2=dustin,reuse4=dustin'
REUSE=(--select 'reuse2={"refresh":2}' --knobs 'reuse2={"lookahead_on_reuse":false}'
    --select 'reuse4={"refresh":4}' --knobs 'reuse4={"lookahead_on_reuse":false}')

job() {
    mkdir -p "$R"
    local C=$D/configs
    export OUT=$R
    export LIMIT=${LIMIT:-300} RAGGED=on
    local acc="dense=3.50,dustin=3.50,streaming=2.95,quest=2.91,snapkv=3.56"
    local trace=(--accept-trace "$D/acceptance-trace.jsonl")
    echo "$(date +%T) random-weight shapes" >> "$R/job.log"
    # SHAPES=0: the evaluations alone
    [ "${SHAPES:-1}" = 0 ] || for b in 16; do
        for m in ar dense dustin; do
            bash "$D/gpu_e2e.sh" run "pair_32k_b${b}_$m" --target "$C/Qwen2.5-1.5B-Instruct.config.json" \
                --ctx 32768 --batch "$b" --budget 2048 --modes "$m" --accept "$acc" "${trace[@]}" \
                > /dev/null 2>&1
        done
    done
    # 72B shapes with `dustin` need more than an H100's 80 GB (docs/perf.md)
    local mib
    mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
    [ "${mib:-0}" -gt 100000 ] || echo "$(date +%T) 72B shapes skipped: ${mib} MiB" >> "$R/job.log"
    [ "${SHAPES:-1}" = 0 ] || [ "${mib:-0}" -le 100000 ] || for b in 8 16; do
        for m in ar dense dustin; do
            bash "$D/gpu_e2e.sh" run "shapes_72b_b${b}_$m" \
                --target "$C/Qwen2.5-72B-Instruct.config.json" --target-layers 20 --ctx 32768 \
                --batch "$b" --budget 2048 --modes "$m" --accept "$acc" "${trace[@]}" \
                > /dev/null 2>&1
        done
    done
    echo "$(date +%T) waiting for the weights" >> "$R/job.log"
    while [ ! -e "$W/ready" ]; do sleep 2; done
    echo "$(date +%T) weights in place" >> "$R/job.log"
    local dustin=$D/dustin
    local c=$D/data/code
    # the commands of docs/fidelity.md, "Reaching 1000 positions per cell": the three books at
    # 67 windows, the four code files at 50 (4096) and the three longer ones at 67 (8192)
    fid() {
        local name=$1
        shift
        echo "$(date +%T) fidelity $name" >> "$R/job.log"
        "$dustin" eval fidelity --device cuda --budget 1/16,1/8,1/4 --spec-tokens 64 \
            --selectors "$SEL" "${REUSE[@]}" "$@" > "$R/fidelity-$name.log" 2>&1
        echo "$(date +%T) rc=$? fidelity $name" >> "$R/job.log"
    }
    fid code-4096 --data "$c/argparse.py,$c/hashbrown_raw.rs,$c/indexmap_map.rs,$c/textwrap.py" \
        --ctx 4096 --windows 50 --out "$R/fidelity-pair-code-1k"
    fid pg19-8192 --data "$D/data/pg19" --ctx 8192 --windows 67 --out "$R/fidelity-pair-pg19-1k"
    fid code-8192 --data "$c/argparse.py,$c/hashbrown_raw.rs,$c/indexmap_map.rs" --ctx 8192 \
        --windows 67 --out "$R/fidelity-pair-code-1k"
    fid pg19-4096 --data "$D/data/pg19" --ctx 4096 --windows 67 --out "$R/fidelity-pair-pg19-1k"
    echo "$(date +%T) pg19 report" >> "$R/job.log"
    "$dustin" eval pg19 --device cuda --data "$D/data/pg19" --ctx 4096,8192 --budget 1/16,1/8,1/4 \
        --windows 67 --spec-tokens 64 --selectors "$SEL" "${REUSE[@]}" \
        --out "$R/fidelity-pair-pg19-1k" > "$R/pg19.log" 2>&1
    # our decoding and HF transformers' on the same prompts, batch 1 (32,600 + 140 positions
    # fit the models' 32,768)
    echo "$(date +%T) acceptance" >> "$R/job.log"
    "$dustin" eval acceptance --device cuda --data "$c/hashbrown_raw.rs,$D/data/pg19/2544.txt" \
        --ctx 8192,32600 --gamma 4 --selectors dense,dustin,streaming,quest,snapkv --budget 1/16 \
        --new-tokens 128 --time-limit 240 --out "$R/acceptance-gpu" > "$R/acceptance.log" 2>&1
    echo "$(date +%T) rc=$? hf peers" >> "$R/job.log"
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$D"/whl/*.whl \
        >> "$R/hf.log" 2>&1
    PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 timeout 300 python3 "$D/hf_pair_gpu.py" \
        --out "$R/acceptance-gpu" --new-tokens 128 > "$R/hf_pair.jsonl" 2>> "$R/hf.log"
    echo "$(date +%T) rc=$? longbench" >> "$R/job.log"
    "$dustin" eval longbench --device cuda --data "$D/data/longbench" --ctx 4096 --max-samples 5 \
        --selectors dense,dustin,streaming,snapkv,quest --budget 1/16,1/8 --out "$R/longbench" \
        > "$R/longbench.log" 2>&1
    echo "$(date +%T) rc=$? done" >> "$R/job.log"
}

case "${1:-}" in
split)
    mkdir -p .w
    M=${DUSTIN_MODELS:-$HOME/.cache/dustin/models}
    split -b "$PART" -d -a 2 "$M/$DR" .w/d
    split -b "$PART" -d -a 2 "$M/$T" .w/t
    ls .w
    ;;
start)
    mkdir -p "$R" "$W/parts"
    OUT=$R . "$D/gpu_mem.sh"
    unpack "$D"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$R/machine.txt"
    setsid nohup bash "$D/gpu_real_pair.sh" job > "$R/job.out" 2>&1 < /dev/null &
    sleep 5
    cat "$R/job.log" 2>/dev/null
    ;;
job)
    job
    ;;
parallel)
    # the rest of the evaluations beside the running job, each into a folder of its own
    # (each process is bound by its host thread and launches, not by the GPU; merge their
    # results.jsonl afterwards, the reports need no model then)
    c=$D/data/code
    par() {
        local name=$1
        shift
        setsid nohup "$D/dustin" eval fidelity --device cuda --budget 1/16,1/8,1/4 \
            --spec-tokens 64 --selectors "$SEL" "${REUSE[@]}" "$@" --out "$R/fid-$name" \
            > "$R/fid-$name.log" 2>&1 < /dev/null &
    }
    par pg19-8192 --data "$D/data/pg19" --ctx 8192 --windows 67
    par code-8192 --data "$c/argparse.py,$c/hashbrown_raw.rs,$c/indexmap_map.rs" --ctx 8192 \
        --windows 67
    par pg19-4096 --data "$D/data/pg19" --ctx 4096 --windows 67
    setsid nohup "$D/dustin" eval longbench --device cuda --data "$D/data/longbench" --ctx 4096 \
        --max-samples 5 --selectors dense,dustin,streaming,snapkv,quest --budget 1/16,1/8 \
        --out "$R/longbench-par" > "$R/longbench-par.log" 2>&1 < /dev/null &
    sleep 1
    ;;
part)
    mkdir -p "$W/parts"
    mv ".w/$2" "$W/parts/$2"
    n=$(ls "$W/parts" | wc -l)
    echo "parts: $n of $((T_PARTS + DR_PARTS)); $(tail -1 "$R/job.log" 2>/dev/null)"
    if [ "$n" -eq $((T_PARTS + DR_PARTS)) ]; then
        cat "$W"/parts/d* > "$W/$DR"
        cat "$W"/parts/t* > "$W/$T"
        if echo "$DR_SHA  $W/$DR" | sha256sum -c - && echo "$T_SHA  $W/$T" | sha256sum -c -; then
            rm -rf "$W/parts"
            touch "$W/ready"
        fi
    fi
    ;;
poll)
    end=$((SECONDS + ${2:-0}))
    while [ $SECONDS -lt "$end" ] && ! grep -q " done" "$R/job.log" 2>/dev/null; do sleep 5; done
    cat "$R/job.log"
    tail -3 "$R"/*.log 2>/dev/null | tail -30
    tar czf "$OUT/results.tgz" -C "$R" . 2>/dev/null
    ;;
*)
    echo "usage: gpu_real_pair.sh split|start|part NAME|parallel|poll [SECS]" >&2
    exit 2
    ;;
esac
