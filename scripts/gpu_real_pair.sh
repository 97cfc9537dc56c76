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
# The background job runs the steps named in STEPS, in order (each step's output in $R/<step>,
# the log in $R/job.log; default "shapes fidelity acceptance hf longbench"); a step that needs
# the real weights waits until every part is in place (sha256 checked):
#   check     `dustin-bench kernel-check --device cuda --model-only`
#   modes     every mode (MODES_LIST) in one process at the pair's shapes, 32k, under the
#             recorded trace, one process per batch size (MODES_BATCHES, default "1 16")
#   kcheck    `dustin-kernels-gpu check --op KCHECK_OP` (staged by `xtask gpu-kernels`; default
#             every op)
#   shapes    random weights at the pair's and (on a card of more than 100 GB) Qwen2.5-72B's
#             shapes under the recorded acceptance trace, one process per (batch, mode);
#             Qwen2.5-7B's at the batch sizes in BATCHES_7B
#   memab     peak GPU memory with weights and KV caches in persistent buffers or in pool pages
#   memtrace  the same log on standard error between `--trace-phases` markers: each
#             reservation's phase (MEMTRACE_MODES, default dustin)
#   memlog    cubecl's full memory log of `dense` (MEMLOG_MODES) at the pair's shapes, 32k, B=16
#   coldwarm  `e2e` without warm-up, PTX cache off / filling / filled: first-use compilation
#   firstiter `dustin`'s first iterations with the PTX cached: per-phase profile, autotune log
#   ab        `$D/dustin-bench-base` (another commit's build) against the staged binary: the
#             pair's shapes per mode (AB_MODES) and draft budget (AB_DB), alternated AB_ROUNDS
#             times, and `dustin`'s first iterations (AB_FIRST=0: not)
#   hostprof  `--host-profile` and `--profile` of `dustin` (HOSTPROF_MODES) at the pair's shapes,
#             with and without a draft budget, and CubeCL's log of the kernels it compiles
#   complog   the kernels `dustin` compiles with 6 and with 24 timed iterations (PTX cache off)
#   latecomp  the iteration at which each kernel is compiled or tuned (LATECOMP_MODES), from
#             CubeCL's logs in order with `e2e --mark-iterations`
#   rkvab     RoPE and the cache write as one launch (`--rope-kv-write off,on`): the full
#             `kernel-check`, then `ar`, `dense`, `dustin` at the pair's shapes in one process
#   draftncu  ncu over a `dustin` (DRAFTNCU_MODES) iteration at the pair's shapes (1 target
#             layer): launches and GPU time per draft layer
#   scoreab   attention scores with the logits in memory or summed in the kernel (`--score-mass
#             off|on`): `dustin-kernels-gpu check --op scores` where staged (`xtask
#             gpu-kernels`), the model-only kernel check, then `dustin` at the pair's shapes
#             per setting (SCOREAB_FLAG, SCOREAB_VALUES pick another switch), with and without
#             a draft budget (SCOREAB_DB: the draft budgets, default "0 2048")
#   launchab  fewer launches a layer: the split-K reduction in the GEMM's launch and the residual
#             add in RMSNorm's (`--split-reduce kernel,fused --fused-residual off,on`), `ar`,
#             `dense` and `dustin` at the pair's shapes, 32k, B=16, with and without a draft
#             budget (LAUNCHAB_DB, default "0,2048"), side by side in one process
#   fidelity  `dustin eval fidelity`, code and PG-19, 4096 and 8192 tokens, and `eval pg19`
#   acceptance, hf  our decoding beside HF `generate` and assisted generation, batch 1
#   longbench `dustin eval longbench`, 5 samples per task
#   evals     acceptance at 1/16 at 4096 and 8192 tokens on every source, and LongBench, side by side
#   batch     `dustin generate` at 32k, B=16, 1 and 8 (BATCHES), every mode, each run twice
#             (cold, then with the kernels compiled; prompts staged in .device/prompts32k/ by
#             `scripts/cut_prompts.py`)
#   subspec   the real target held to 1 GiB of GPU memory: its substitute draft vs offloaded AR
set -u
D=.device
R=${R:-/root/dustin-real}
W=/root/.cache/dustin/models
T=qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
DR=qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
T_SHA=cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046
DR_SHA=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
# a run carries at most 64 MiB with the tracked tree (about 6 MiB) included: parts of 50 MB
PART=50000000
T_PARTS=23
DR_PARTS=10
# every selector of the fidelity tables, and the paper's reuse beside re-ranking
SEL='dense,streaming,h2o,snapkv,quest,oracle,draft-only,history-only,dustin,pyramid(dustin),reuse2=dustin,reuse4=dustin'
REUSE=(--select 'reuse2={"refresh":2}' --knobs 'reuse2={"lookahead_on_reuse":false}'
    --select 'reuse4={"refresh":4}' --knobs 'reuse4={"lookahead_on_reuse":false}')

C=$D/configs
ACC="dense=3.50,dustin=3.50,streaming=2.95,quest=2.91,snapkv=3.56"
TRACE=(--accept-trace "$D/acceptance-trace.jsonl")
PAIR=(--model qwen2.5-coder-1.5b-instruct --draft qwen2.5-coder-0.5b-instruct)
log() { echo "$(date +%T) $*" >> "$R/job.log"; }

# the whole-model rows of the kernel check, the draft's lookahead of a proposal among them
step_check() {
    log "kernel-check"
    "$D/dustin-bench" kernel-check --device cuda --model-only > "$R/kernel-check.txt" 2>&1
    log "rc=$? kernel-check"
}

# 1. random weights at the pair's and Qwen2.5-72B's shapes (20 of 80 layers; batch 16 only on
# a card of more than 100 GB) under the recorded acceptance trace, one process per (batch,
# mode) so that each mode's peak GPU memory is its own
step_shapes() {
    log "random-weight shapes"
    # PAIR_SHAPES=0: the 72B shapes alone
    [ "${PAIR_SHAPES:-1}" = 0 ] || for m in ar dense dustin; do
        bash "$D/gpu_e2e.sh" run "pair_32k_b16_$m" --target "$C/Qwen2.5-1.5B-Instruct.config.json" \
            --ctx 32768 --batch 16 --budget 2048 --modes "$m" --accept "$ACC" "${TRACE[@]}" \
            > /dev/null 2>&1
    done
    # 72B shapes at B=16 hold 41 GB of weights and 43 GB of KV cache: more than an H100's 80 GB
    # BATCHES_72B: the batch sizes to run (default 8 and 16)
    local mib batches=${BATCHES_72B:-8 16}
    mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
    if [ "${mib:-0}" -le 100000 ]; then
        log "72B shapes at B=16 skipped: ${mib} MiB"
        batches=${batches//16/}
    fi
    for b in $batches; do
        for m in ar dense dustin; do
            bash "$D/gpu_e2e.sh" run "shapes_72b_b${b}_$m" \
                --target "$C/Qwen2.5-72B-Instruct.config.json" --target-layers 20 --ctx 32768 \
                --batch "$b" --budget 2048 --modes "$m" --accept "$ACC" "${TRACE[@]}" \
                > /dev/null 2>&1
        done
    done
    # BATCHES_7B: Qwen2.5-7B's shapes (all 28 layers) at these batch sizes (default none)
    for b in ${BATCHES_7B:-}; do
        for m in ar dense dustin; do
            bash "$D/gpu_e2e.sh" run "shapes_7b_b${b}_$m" \
                --target "$C/Qwen2.5-7B-Instruct.config.json" --ctx 32768 \
                --batch "$b" --budget 2048 --modes "$m" --accept "$ACC" "${TRACE[@]}" \
                > /dev/null 2>&1
        done
    done
}

# peak GPU memory with the weights and KV caches in persistent buffers and in pool pages
# (`dustin-bench e2e --persistent-alloc`), the pair's shapes at 32k, B=16, one process per
# (mode, setting); the `dense` runs also log cubecl's memory pages
step_memab() {
    log "persistent allocations on/off"
    for m in ar dense dustin; do
        for pa in on off; do
            if [ "$m" = dense ]; then
                printf '[memory.logger]\nlevel = "basic"\nfile = "%s"\n' "$R/cubecl-mem-$pa.log" \
                    > cubecl.toml
            fi
            bash "$D/gpu_e2e.sh" run "pair_32k_b16_${m}_pa$pa" \
                --target "$C/Qwen2.5-1.5B-Instruct.config.json" --ctx 32768 --batch 16 \
                --budget 2048 --modes "$m" --accept "$ACC" "${TRACE[@]}" --persistent-alloc "$pa" \
                > /dev/null 2>&1
            rm -f cubecl.toml
        done
    done
    log "memab done"
}

# every reservation of cubecl's memory pools (`level = "full"`: size, pool, and each new page
# with the pools' state) while `dense` and `dustin` run at the pair's shapes, 32k, B=16, a few
# iterations; `MEMLOG_MODES` picks the modes
step_memlog() {
    local m
    for m in ${MEMLOG_MODES:-dense}; do
        log "memory log $m"
        printf '[memory.logger]\nlevel = "full"\nfile = "%s"\n' "$R/cubecl-mem-full-$m.log" \
            > cubecl.toml
        WARMUP=1 ITERS=2 bash "$D/gpu_e2e.sh" run "memlog_$m" \
            --target "$C/Qwen2.5-1.5B-Instruct.config.json" --ctx 32768 --batch 16 \
            --budget 2048 --modes "$m" --accept "$ACC" "${TRACE[@]}" > /dev/null 2>&1
        rm -f cubecl.toml
        gzip -f "$R/cubecl-mem-full-$m.log"
    done
    log "memlog done"
}

# first-use compilation: `e2e` without warm-up at the pair's shapes, 32k, B=16, three fresh
# processes: with CubeCL's PTX disk cache off, then twice with an empty cache folder of its
# own (the first run fills it, the second loads from it)
step_coldwarm() {
    local dir=/tmp/dustin-ptx-coldwarm run cache
    rm -rf "$dir"
    for run in off fill cached; do
        cache=$dir
        [ "$run" = off ] && cache=off
        log "coldwarm $run"
        DUSTIN_CUBECL_CACHE=$cache WARMUP=0 ITERS=6 bash "$D/gpu_e2e.sh" run "coldwarm_$run" \
            --target "$C/Qwen2.5-1.5B-Instruct.config.json" --ctx 32768 --batch 16 \
            --budget 2048 --modes ar,dense,dustin --accept "$ACC" "${TRACE[@]}" > /dev/null 2>&1
    done
    log "coldwarm done"
}

# what `dustin`'s first iteration still spends once the PTX is cached: a fresh process without
# warm-up, per-phase profile of every iteration, cubecl's autotune log (run after `coldwarm` or
# `shapes`, which fill the cache)
step_firstiter() {
    log "first iteration"
    printf '[autotune.logger]\nlevel = "full"\nfile = "%s"\n' "$R/autotune-firstiter.log" \
        > cubecl.toml
    WARMUP=0 ITERS=3 PROFILE=1 bash "$D/gpu_e2e.sh" run firstiter_dustin \
        --target "$C/Qwen2.5-1.5B-Instruct.config.json" --ctx 32768 --batch 16 --budget 2048 \
        --modes dustin --accept "$ACC" "${TRACE[@]}" > /dev/null 2>&1
    rm -f cubecl.toml
    log "first iteration done"
}

# the staged binary against another commit's (`$D/dustin-bench-base`, staged by hand from
# that commit's `gpu-e2e` build) at the pair's shapes, 32k, B=16: each mode in a process of
# its own, base then new, and `dustin`'s profiled first iterations (as `firstiter`)
step_ab() {
    log "base against new"
    local m bin r db
    # `$D/dustin-bench-base`, and the staged `$D/dustin-bench` for "new"
    ln -sf dustin-bench "$D/dustin-bench-new"
    # AB_MODES (default "ar dense dustin"), AB_DB (draft budgets of the speculative rows, one
    # process each, default 0), AB_ROUNDS (base, new alternated this many times, default 1),
    # AB_FIRST=0 skips `dustin`'s first iterations
    # `ar` reads no draft budget: it runs at the first one only
    local first_db=${AB_DB:-0}
    first_db=${first_db%% *}
    for r in $(seq 1 "${AB_ROUNDS:-1}"); do
        for m in ${AB_MODES:-ar dense dustin}; do
            for db in ${AB_DB:-0}; do
                [ "$m" = ar ] && [ "$db" != "$first_db" ] && continue
                for bin in base new; do
                    BIN=$D/dustin-bench-$bin bash "$D/gpu_e2e.sh" run \
                        "pair_32k_b16_${m}_db${db}_r${r}_$bin" \
                        --target "$C/Qwen2.5-1.5B-Instruct.config.json" --ctx 32768 --batch 16 \
                        --budget 2048 --modes "$m" --draft-budget "$db" --accept "$ACC" \
                        "${TRACE[@]}" > /dev/null 2>&1
                    log "rc=$? ab $m db$db r$r $bin"
                done
            done
        done
    done
    if [ "${AB_FIRST:-1}" = 1 ]; then
        for bin in base new; do
            BIN=$D/dustin-bench-$bin WARMUP=0 ITERS=3 PROFILE=1 bash "$D/gpu_e2e.sh" run \
                "firstiter_dustin_$bin" --target "$C/Qwen2.5-1.5B-Instruct.config.json" \
                --ctx 32768 --batch 16 --budget 2048 --modes dustin --accept "$ACC" \
                "${TRACE[@]}" > /dev/null 2>&1
        done
    fi
    log "ab done"
}

# where the host's time goes in `dustin`'s decoding at the pair's shapes, 32k, B=16, with and
# without a draft budget (HOSTPROF_DB, default "0,2048"): `--host-profile` (sampled stacks
# and per-phase wall times) in $R/host; HOSTPROF_PROFILE=0 leaves out `--profile` (its device
# waits around each phase), so the stacks are those of the unsynced iteration
step_hostprof() {
    log "hostprof"
    # every kernel compiled in the process (CubeCL's compilation log): with the PTX cache
    # filled by the steps before, the kernels first met past their warm-up
    printf '[compilation.logger]\nlevel = "basic"\nfile = "%s"\n' "$R/compile-hostprof.log" \
        > cubecl.toml
    ITERS=${HOSTPROF_ITERS:-24} LIMIT=${HOSTPROF_LIMIT:-200} bash "$D/gpu_e2e.sh" run \
        pair_32k_b16_hostprof --target "$C/Qwen2.5-1.5B-Instruct.config.json" --ctx 32768 \
        --batch 16 --budget 2048 --modes "${HOSTPROF_MODES:-dustin}" \
        --draft-budget "${HOSTPROF_DB:-0,2048}" --accept "$ACC" "${TRACE[@]}" \
        --host-profile "$R/host" $([ "${HOSTPROF_PROFILE:-1}" = 0 ] || echo --profile) \
        > /dev/null 2>&1
    log "rc=$? hostprof"
    rm -f cubecl.toml
}

# which iteration first meets each kernel compiled or tuned while decoding: CubeCL's
# compilation and autotune logs on stderr (a `cubecl.toml` in the working folder), in order
# with `e2e --mark-iterations`, one process per mode (LATECOMP_MODES, default "quest snapkv
# dustin") at the pair's shapes, 32k, B=16 (LATECOMP_BATCHES: other batch sizes);
# $R/latecomp_MODE.txt holds each whole log and $R/latecomp.txt the log lines met after the
# first warm-up iteration
step_latecomp() {
    log "latecomp"
    printf '[compilation.logger]\nlevel = "basic"\nstderr = true\n[autotune.logger]\nlevel = "minimal"\nstderr = true\n' \
        > cubecl.toml
    local m b n
    # LATECOMP_BATCHES: the batch sizes (default 16); the logs of B=16 keep their old names
    for b in ${LATECOMP_BATCHES:-16}; do
        for m in ${LATECOMP_MODES:-quest snapkv dustin}; do
            n=$m
            [ "$b" = 16 ] || n=${m}_b$b
            LIMIT=${LATECOMP_LIMIT:-150} bash "$D/gpu_e2e.sh" run "latecomp_$n" \
                --target "$C/Qwen2.5-1.5B-Instruct.config.json" --ctx 32768 --batch "$b" \
                --budget 2048 --modes "$m" --accept "$ACC" "${TRACE[@]}" --mark-iterations \
                > /dev/null 2>&1
            log "rc=$? latecomp $n"
            # from the end of the first warm-up iteration on: the markers and every other line
            awk -v m="$n" '/: iteration 1 done/ {on = 1} on && !/^\|/ {print m ": " $0}' \
                "$R/latecomp_$n.txt" >> "$R/latecomp.txt"
        done
    done
    rm -f cubecl.toml
}

# kernels compiled past the warm-up: `dustin` at the pair's shapes with the PTX cache off and
# CubeCL's compilation log on, 6 and then 24 timed iterations (COMPLOG_ITERS); a kernel in
# the longer run's log only is first met after the shorter run's last iteration
step_complog() {
    log "complog"
    local it
    for it in ${COMPLOG_ITERS:-6 24}; do
        printf '[compilation.logger]\nlevel = "basic"\nfile = "%s"\n' "$R/compile-iters$it.log" \
            > cubecl.toml
        DUSTIN_CUBECL_CACHE=off ITERS=$it bash "$D/gpu_e2e.sh" run "pair_32k_b16_complog_$it" \
            --target "$C/Qwen2.5-1.5B-Instruct.config.json" --ctx 32768 --batch 16 \
            --budget 2048 --modes dustin --accept "$ACC" "${TRACE[@]}" > /dev/null 2>&1
        log "rc=$? complog $it: $(wc -l < "$R/compile-iters$it.log") kernels compiled"
    done
    rm -f cubecl.toml
}

# which phase makes each allocation: `dustin` at the pair's shapes, 32k, B=16 (MEMTRACE_MODES),
# 1 warm-up and 1 timed iteration, with `--profile --trace-phases` and CubeCL's full memory
# log both on standard error, so each reservation sits between its phase's start and end
# markers ($R/memtrace-<mode>.log.gz)
step_memtrace() {
    log "memtrace"
    local m
    for m in ${MEMTRACE_MODES:-dustin}; do
        printf '[memory.logger]\nlevel = "full"\nstderr = true\n' > cubecl.toml
        timeout 300 "$D/dustin-bench" e2e --device cuda \
            --target "$C/Qwen2.5-1.5B-Instruct.config.json" \
            --draft "$C/Qwen2.5-0.5B-Instruct.config.json" --ctx 32768 --batch 16 \
            --budget 2048 --modes "$m" --accept "$ACC" "${TRACE[@]}" --ragged-accept on \
            --warmup 1 --iters 1 --profile --trace-phases > "$R/memtrace-$m.out" \
            2> "$R/memtrace-$m.log"
        log "rc=$? memtrace $m"
        rm -f cubecl.toml
        gzip -f "$R/memtrace-$m.log"
    done
}

# attention scores two ways side by side (`KernelConfig::score_mass`, or SCOREAB_FLAG, e.g.
# --score-kernel with SCOREAB_VALUES "flash split"): their checks against the float64
# reference first, then `dustin` at the pair's shapes, 32k, B=16, one process per (setting,
# draft budget 0 / 2048)
step_modes() {
    log "modes"
    local b
    for b in ${MODES_BATCHES:-1 16}; do
        bash "$D/gpu_e2e.sh" run "pair_32k_b${b}_modes" \
            --target "$C/Qwen2.5-1.5B-Instruct.config.json" --ctx 32768 --batch "$b" \
            --budget 2048 --modes "${MODES_LIST:-ar,dense,dustin,streaming,quest,snapkv}" \
            --accept "$ACC" "${TRACE[@]}" > /dev/null 2>&1
        log "rc=$? modes b$b"
    done
}

step_kcheck() {
    log "kernel checks"
    local op=()
    [ -n "${KCHECK_OP:-}" ] && op=(--op "$KCHECK_OP")
    timeout 400 "$D/dustin-kernels-gpu" check "${op[@]}" > "$R/check_kernels.txt" 2>&1
    log "rc=$? check kernels: $(tail -1 "$R/check_kernels.txt")"
}

step_scoreab() {
    log "score kernels"
    # every kernel's check (SCOREAB_CHECK=scores: the scores' only), then the model's
    # (SCOREAB_MODEL_CHECK=0 skips it)
    if [ -x "$D/dustin-kernels-gpu" ]; then
        KCHECK_OP=${SCOREAB_CHECK:-} step_kcheck
    fi
    if [ "${SCOREAB_MODEL_CHECK:-1}" = 1 ]; then
        timeout 300 "$D/dustin-bench" kernel-check --device cuda --model-only \
            > "$R/kernel-check.txt" 2>&1
        log "rc=$? kernel-check"
    fi
    local sk db flag=${SCOREAB_FLAG:---score-mass}
    for db in ${SCOREAB_DB:-0 2048}; do
        for sk in ${SCOREAB_VALUES:-off on}; do
            bash "$D/gpu_e2e.sh" run "pair_32k_b16_dustin_db${db}_$sk" \
                --target "$C/Qwen2.5-1.5B-Instruct.config.json" --ctx 32768 --batch 16 \
                --budget 2048 --draft-budget "$db" --modes dustin "$flag" "$sk" \
                --accept "$ACC" "${TRACE[@]}" > /dev/null 2>&1
        done
    done
    log "scoreab done"
}

# fewer launches a layer, side by side in one process: the skinny GEMMs' split-K reduction in
# a kernel of its own or in the GEMM's last block, the residual add apart from RMSNorm or in
# it; every mode at the pair's shapes, 32k, B=16, with and without a draft budget
step_launchab() {
    log "launchab"
    LIMIT=${LAUNCHAB_LIMIT:-450} RESIDUAL=off,on bash "$D/gpu_e2e.sh" run pair_32k_b16_launchab \
        --target "$C/Qwen2.5-1.5B-Instruct.config.json" --ctx 32768 --batch 16 --budget 2048 \
        --modes ar,dense,dustin --draft-budget "${LAUNCHAB_DB:-0,2048}" \
        --split-reduce kernel,fused --accept "$ACC" "${TRACE[@]}" > /dev/null 2>&1
    log "launchab done"
}

# RoPE and the cache write as one launch: every kernel's check (the new op's rows and the
# model's, where it runs on the `model` path), then `--rope-kv-write off,on` with `ar`,
# `dense` and `dustin` at the pair's shapes, 32k, B=16, with and without a draft budget
# (RKVAB_DB, default "0,2048"), side by side in one process (RKVAB_MODES: other modes,
# RKVAB_EXTRA: more flags)
step_rkvab() {
    log "rkvab"
    "$D/dustin-bench" kernel-check --device cuda > "$R/kernel-check-full.txt" 2>&1
    log "rc=$? kernel-check: $(tail -1 "$R/kernel-check-full.txt")"
    LIMIT=${RKVAB_LIMIT:-450} RKV=off,on bash "$D/gpu_e2e.sh" run pair_32k_b16_rkvab \
        --target "$C/Qwen2.5-1.5B-Instruct.config.json" --ctx 32768 --batch 16 --budget 2048 \
        --modes "${RKVAB_MODES:-ar,dense,dustin}" --draft-budget "${RKVAB_DB:-0,2048}" ${RKVAB_EXTRA:-} \
        --accept "$ACC" "${TRACE[@]}" > /dev/null 2>&1
    log "rc=$? rkvab"
}

# every kernel of a speculative iteration under ncu (`gpu_e2e.sh draftncu`) at the pair's
# shapes: the 1.5B cut to 1 layer, the 0.5B draft, 32k, B=16, `dustin`: launches and GPU time
# per draft layer
step_draftncu() {
    log "draftncu"
    mkdir -p "$R/draftncu"
    OUT=$R/draftncu TARGET=$C/Qwen2.5-1.5B-Instruct.config.json B=16 MODES=${DRAFTNCU_MODES:-dustin} \
        EXTRA="--budget 2048 --accept-trace $D/acceptance-trace.jsonl ${DRAFTNCU_EXTRA:-}" \
        TAG=${DRAFTNCU_TAG:-draft} bash "$D/gpu_e2e.sh" draftncu \
        > "$R/draftncu.log" 2>&1
    log "rc=$? draftncu"
}

weights() {
    log "waiting for the weights"
    while [ ! -e "$W/ready" ]; do sleep 2; done
    log "weights in place"
}

# 2. the real pair: `dustin eval fidelity` on code and on PG-19 at 4096 and 8192 tokens
# (>= 1000 verified positions per cell) with `eval pg19`'s perplexity report
step_fidelity() {
    local c=$D/data/code
    # the commands of docs/fidelity.md, "Reaching 1000 positions per cell": the three books at
    # 67 windows, the four code files at 50 (4096) and the three longer ones at 67 (8192)
    fid() {
        local name=$1
        shift
        log "fidelity $name"
        "$D/dustin" eval fidelity --device cuda --budget 1/16,1/8,1/4 --spec-tokens 64 \
            --selectors "$SEL" "${REUSE[@]}" "$@" > "$R/fidelity-$name.log" 2>&1
        log "rc=$? fidelity $name"
    }
    fid code-4096 --data "$c/argparse.py,$c/hashbrown_raw.rs,$c/indexmap_map.rs,$c/textwrap.py" \
        --ctx 4096 --windows 50 --out "$R/fidelity-pair-code-1k"
    fid pg19-8192 --data "$D/data/pg19" --ctx 8192 --windows 67 --out "$R/fidelity-pair-pg19-1k"
    fid code-8192 --data "$c/argparse.py,$c/hashbrown_raw.rs,$c/indexmap_map.rs" --ctx 8192 \
        --windows 67 --out "$R/fidelity-pair-code-1k"
    fid pg19-4096 --data "$D/data/pg19" --ctx 4096 --windows 67 --out "$R/fidelity-pair-pg19-1k"
    log "pg19 report"
    "$D/dustin" eval pg19 --device cuda --data "$D/data/pg19" --ctx 4096,8192 --budget 1/16,1/8,1/4 \
        --windows 67 --spec-tokens 64 --selectors "$SEL" "${REUSE[@]}" \
        --out "$R/fidelity-pair-pg19-1k" > "$R/pg19.log" 2>&1
}

# our decoding and HF transformers' on the same prompts, batch 1 (32,600 + 140 positions fit
# the models' 32,768)
step_acceptance() {
    local c=$D/data/code
    log "acceptance"
    "$D/dustin" eval acceptance --device cuda --data "$c/hashbrown_raw.rs,$D/data/pg19/2544.txt" \
        --ctx 8192,32600 --gamma 4 --selectors dense,dustin,streaming,quest,snapkv --budget 1/16 \
        --new-tokens 128 --time-limit 240 --out "$R/acceptance-gpu" > "$R/acceptance.log" 2>&1
    log "rc=$? acceptance"
}

step_hf() {
    log "hf peers"
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$D"/whl/*.whl \
        >> "$R/hf.log" 2>&1
    PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 timeout 300 python3 "$D/hf_pair_gpu.py" \
        --out "$R/acceptance-gpu" --new-tokens 128 > "$R/hf_pair.jsonl" 2>> "$R/hf.log"
    log "rc=$? hf peers"
}

step_longbench() {
    log "longbench"
    "$D/dustin" eval longbench --device cuda --data "$D/data/longbench" --ctx 4096 --max-samples 5 \
        --selectors dense,dustin,streaming,snapkv,quest --budget 1/16,1/8 --out "$R/longbench" \
        > "$R/longbench.log" 2>&1
    log "rc=$? longbench"
}

# the evaluations of Dustin's speculative loop, side by side (each process is bound by its host
# thread and launches, not by the GPU): acceptance at 1/16 on the seven sources at 4096 and
# the six long enough at 8192 (the CPU tables' sources and modes, 128 tokens), and LongBench
# (a results.jsonl staged as `.device/longbench-prev.jsonl` is resumed from)
step_evals() {
    local c=$D/data/code p=$D/data/pg19 sel=dense,dustin,draft-only,streaming,quest,snapkv
    local long="$c/argparse.py,$c/hashbrown_raw.rs,$c/indexmap_map.rs,$p/10762.txt,$p/15562.txt,$p/2544.txt"
    log "evals"
    "$D/dustin" eval acceptance --device cuda --data "$long,$c/textwrap.py" --ctx 4096 --gamma 4 \
        --selectors "$sel" --budget 1/16 --new-tokens 128 --out "$R/acceptance-4k" \
        > "$R/acceptance-4k.log" 2>&1 &
    "$D/dustin" eval acceptance --device cuda --data "$long" --ctx 8192 --gamma 4 \
        --selectors "$sel" --budget 1/16 --new-tokens 128 --out "$R/acceptance-8k" \
        > "$R/acceptance-8k.log" 2>&1 &
    mkdir -p "$R/longbench"
    [ -e "$D/longbench-prev.jsonl" ] && cp "$D/longbench-prev.jsonl" "$R/longbench/results.jsonl"
    step_longbench &
    wait
    log "evals done"
}

# the real pair in batches at 32k (`dustin generate`, one process per run, so that each peak
# GPU memory is its own): 128 greedy tokens per sequence after prompts of 32,000 tokens of
# PG-19 and code (`.device/prompts32k/`, cut by `scripts/cut_prompts.py`). Each run goes
# twice, `NAME_cold` then `NAME`: a process compiles every kernel at its first use, and
# sequences that finish at different iterations bring new shapes; `dustin` keeps the compiled
# PTX on disk (`dustin_kernels::cuda::compile_cache`) and cubecl its autotune results, so the
# second run of the same command finds them compiled and tuned
step_batch() {
    if ! ls "$D"/prompts32k/*.txt > /dev/null 2>&1; then
        log "batch skipped: no prompts in $D/prompts32k"
        return
    fi
    mkdir -p "$R/batch"
    local OUT=$R/batch
    gen() {
        local name=$1 b=$2
        shift 2
        local files=()
        for f in $(ls "$D"/prompts32k/*.txt | head -"$b"); do files+=(--prompt-file "$f"); done
        local run
        for run in "${name}_cold" "$name"; do
            log "batch $run"
            mem_watch "$run"
            timeout "${GEN_LIMIT:-200}" "$D/dustin" generate --device cuda "${files[@]}" \
                --max-new-tokens 128 --output "$OUT/$run.json" "$@" > "$OUT/$run.txt" 2>&1
            local rc=$?
            echo "{\"group\":\"$run\",\"rc\":$rc,\"peak_mib\":$(mem_peak_max "$run")}" >> "$OUT/mem.jsonl"
        done
    }
    for b in ${BATCHES:-16 1 8}; do
        gen "b${b}_ar" "$b" --model qwen2.5-coder-1.5b-instruct
        gen "b${b}_dense" "$b" "${PAIR[@]}"
        gen "b${b}_dustin" "$b" "${PAIR[@]}" --selector dustin --budget 2048
        [ "$b" = 16 ] || continue
        gen "b${b}_dustin_db2048" "$b" "${PAIR[@]}" --selector dustin --budget 2048 --draft-budget 2048
        gen "b${b}_dustin_8th" "$b" "${PAIR[@]}" --selector dustin --budget 4096
        for s in streaming quest snapkv; do
            gen "b${b}_$s" "$b" "${PAIR[@]}" --selector "$s" --budget 2048
        done
    done
    log "batch done"
}

# SubSpec with the real target: held to 1 GiB of GPU memory (the layers that do not fit copied
# in for each forward pass), its 4-bit substitute as the draft, against offloaded
# autoregressive decoding at the same budget; one 8k prompt, 64 tokens
step_subspec() {
    mkdir -p "$R/subspec"
    local f=$D/prompts32k/01.txt
    head -c 30000 "$f" > "$R/subspec/prompt.txt"
    for m in ar subspec; do
        local extra=()
        [ "$m" = subspec ] && extra=(--draft substitute)
        log "subspec $m"
        timeout 200 "$D/dustin" generate --device cuda --model qwen2.5-coder-1.5b-instruct \
            --gpu-memory 1G --prompt-file "$R/subspec/prompt.txt" --max-new-tokens 64 \
            "${extra[@]}" > "$R/subspec/$m.txt" 2>&1
        log "rc=$? subspec $m"
    done
}

# the steps named in STEPS, in order (default: the first GPU run with the real weights)
job() {
    mkdir -p "$R"
    export OUT=$R
    export LIMIT=${LIMIT:-300} RAGGED=on
    . "$D/gpu_mem.sh"
    local step waited=0
    for step in ${STEPS:-shapes fidelity acceptance hf longbench}; do
        case $step in
        check | kcheck | modes | shapes | memab | memlog | memtrace | coldwarm | firstiter | ab | draftncu | scoreab | launchab | hostprof | rkvab | complog | latecomp) ;;
        *) [ $waited = 1 ] || weights; waited=1 ;;
        esac
        "step_$step"
    done
    log "done"
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
    # an earlier job's log (its `done` line would end this job's `poll` at once) kept apart
    [ -f "$R/job.log" ] && mv "$R/job.log" "$R/job-$(date +%H%M%S).log"
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
    while [ $SECONDS -lt "$end" ] && ! grep -qE '^[0-9:]+ done$' "$R/job.log" 2>/dev/null; do
        # a job that died (a shell error: job.out has it) never logs `done`: stop waiting
        if ! pgrep -f 'gpu_real_pair.sh job' > /dev/null; then
            echo "the job is not running:"
            tail -5 "$R/job.out" 2>/dev/null
            break
        fi
        sleep 5
    done
    cat "$R/job.log"
    tail -3 "$R"/*.log 2>/dev/null | tail -30
    tar czf "$OUT/results.tgz" -C "$R" . 2>/dev/null
    ;;
*)
    echo "usage: gpu_real_pair.sh split|start|part NAME|parallel|poll [SECS]" >&2
    exit 2
    ;;
esac
