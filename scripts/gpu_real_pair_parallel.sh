#!/usr/bin/env bash
# Starts the rest of the real pair's evaluations beside the running `gpu_real_pair.sh job`
# (each process is bound by its host thread and kernel launches, not by the GPU): fidelity on
# PG-19 at 8192 and 4096 and on code at 8192, and LongBench, each into a folder of its own
# (merge their results.jsonl afterwards; the reports need no model then).
set -u
D=.device
R=${R:-/root/dustin-real}
dustin=$D/dustin
sel='dense,streaming,h2o,snapkv,quest,oracle,draft-only,history-only,dustin,pyramid(dustin),reuse2=dustin,reuse4=dustin'
reuse=(--select 'reuse2={"refresh":2}' --knobs 'reuse2={"lookahead_on_reuse":false}'
    --select 'reuse4={"refresh":4}' --knobs 'reuse4={"lookahead_on_reuse":false}')
c=$D/data/code
fid() {
    local name=$1
    shift
    setsid nohup "$dustin" eval fidelity --device cuda --budget 1/16,1/8,1/4 --spec-tokens 64 \
        --selectors "$sel" "${reuse[@]}" "$@" --out "$R/fid-$name" > "$R/fid-$name.log" 2>&1 < /dev/null &
}
fid pg19-8192 --data "$D/data/pg19" --ctx 8192 --windows 67
fid code-8192 --data "$c/argparse.py,$c/hashbrown_raw.rs,$c/indexmap_map.rs" --ctx 8192 --windows 67
fid pg19-4096 --data "$D/data/pg19" --ctx 4096 --windows 67
setsid nohup "$dustin" eval longbench --device cuda --data "$D/data/longbench" --ctx 4096 \
    --max-samples 5 --selectors dense,dustin,streaming,snapkv,quest --budget 1/16,1/8 \
    --out "$R/longbench-par" > "$R/longbench-par.log" 2>&1 < /dev/null &
sleep 1
