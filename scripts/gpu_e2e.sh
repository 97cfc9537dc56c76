#!/usr/bin/env bash
# End-to-end GPU benchmark (dustin-bench e2e), run on the GPU machine from the repository root with
# `.device` carried (staged by `cargo run --release -p xtask -- gpu-e2e`).
#   bash .device/gpu_e2e.sh 7b    # row-score kernel check; Qwen2.5-7B target + 0.5B draft,
#                                 # contexts 32k, 8k, 16k, batch 1, 8, 16, every mode
#   bash .device/gpu_e2e.sh 72b   # Qwen2.5-72B shapes (first 20 of 80 layers) + 0.5B draft,
#                                 # 32k, batch 8, 16; HF transformers peers at 7B
#   bash .device/gpu_e2e.sh grid  # 7B at 32k, 72B, 7B at 8k and 16k (no check, no peers); then,
#                                 # on this machine, `dustin-bench plot --json <its e2e.jsonl>
#                                 # --batch 8 --target-layers 28 --out docs/perf/....svg` draws
#                                 # tokens/s against context per mode (and its table)
#   bash .device/gpu_e2e.sh plot  # the tokens/s-against-context plot's data alone: 7B at B=8, contexts 8k, 16k, 32k,
#                                 # every mode (about 5 minutes); draw it here with `dustin-bench plot`
#   bash .device/gpu_e2e.sh hf    # the HF transformers peers only
#   bash .device/gpu_e2e.sh final # 32k: 7B B 1/8/16, 72B B 8 (HF=1: HF peers at 32k B 1/8)
#   bash .device/gpu_e2e.sh skinny # 7B and 72B (20 layers) at 32k, B 8, ar/dense/dustin: the
#                                 # skinny GEMMs' default (auto) against CUDA cores + Burn's matmul
#   bash .device/gpu_e2e.sh launch # 7B 32k B 1/8: skinny GEMM on tensor cores vs CUDA cores,
#                                 # fused residual, ragged acceptance with and without kv_write
#   bash .device/gpu_e2e.sh verifyk # 7B 32k B 8, ragged acceptance, ar/dense/dustin: verification
#                                 # on the split kernel, the flash kernel, and `auto` (KERNELS:
#                                 # which of them, default all three)
#   bash .device/gpu_e2e.sh s7    # ragged acceptance, ar/dense/dustin: 7B 32k B 1/8, 72B (20
#                                 # layers) 32k B 8
#   bash .device/gpu_e2e.sh next  # elementwise, then trace, in one run
#   bash .device/gpu_e2e.sh draftncu # every kernel of a speculative iteration in order, with its
#                                 # GPU time (ncu; 7B cut to 1 layer, 0.5B draft, 32k, B 8)
#   bash .device/gpu_e2e.sh where # GPU utilization while decoding, and every kernel's GPU time
#                                 # (ncu) in a small run
#   bash .device/gpu_e2e.sh trace # cubecl's autotune log of `dustin` at B 1 and 8, then a
#                                 # per-kernel trace at B 1 (7B, 32k)
#   bash .device/gpu_e2e.sh elementwise # `dustin-bench kernel-check --device cuda`, then 7B at 32k,
#                                 # B 1/8 per CONFIGS (default: skinny GEMM without and with
#                                 # the grouped q/k/v and gate/up GEMMs)
#   bash .device/gpu_e2e.sh draft # 7B 32k B 8, dense/dustin: lookahead scoring deferred vs
#                                 # per step, then dense draft vs one of DRAFT_BUDGETS tokens
#   bash .device/gpu_e2e.sh selectab # both top-k kernels checked and timed; 7B 32k B 8 dense
#                                 # and dustin, estimator kernels off/on x top-k block/warp in
#                                 # one process (HOST=1: a host profile of each row)
#   bash .device/gpu_e2e.sh lalayers # 7B and 72B shapes 32k B 8: dense (72B: and ar), and
#                                 # dustin's lookahead from all / every 2nd / the later half of
#                                 # the draft's layers (LA; synced phases)
#   bash .device/gpu_e2e.sh dropab # 7B 32k B 8 and 72B shapes (20 layers) B 8/16: dustin's
#                                 # early refresh with and without the noise test side by side
#   bash .device/gpu_e2e.sh run NAME ARGS... # one group named NAME: `dustin-bench e2e` with ARGS after
#                                 # the common flags (any shapes and modes, one process)
#   bash .device/gpu_e2e.sh ab    # 7B 32k B 8: $D/dustin-base (staged by hand) against $D/dustin-bench,
#                                 # which runs each mode with the fused residual off and on
# Env: WARMUP / ITERS (warm-up and timed iterations per row, default 3 and 6; a group's ARGS
# must not repeat them), ROUNDS (`--rounds`: every mode's rows that many times in turn, A B A
# B, to see and cancel the order within a process), SYNC (non-empty: `--sync-phases on`, a device sync at the end of
# each phase, so that each phase column holds its own GPU work), OUT (results folder), BIN (the binary `group` runs; default $D/dustin-bench), TAU (mean acceptance length of every speculative mode, default
# 1.36: dense and dustin on SmolLM2 at 4096 tokens, docs/fidelity.md), LIMIT (seconds per
# group), PROFILE (non-empty: `--profile`, the phase times of every mode, slower runs),
# ELEMENTWISE (`fused`, the default, or `plain`: `--elementwise`), SKINNY (`on`, the default,
# or `off`: `--skinny-gemm`), GROUPED (`on`, the default, or `off`: `--grouped-gemm`),
# RESIDUAL (`off`, the default, `on`, or `off,on`: `--fused-residual`, a list runs both side by side), RAGGED (`off`, the default, or
# `on`: `--ragged-accept`, per-sequence shifted schedules), KVWRITE (`on`, the default, or
# `off`: `--kv-write-kernel`), SKMMA (`auto`, the default, `mma`, `ring`, `no-ring` or `cores`: `--skinny-kernel`), RING (`COLSxKCxBUFS`: `--ring-config`),
# VERIFYK (`auto`, the default, `flash` or `split`: `--verify-kernel`). Each
# group is one process; nvidia-smi samples its memory every 100 ms (peak in
# mem.jsonl).
set -u
D=.device
C=$D/configs
OUT=${OUT:-/tmp/dustin-e2e}
mkdir -p "$OUT"
. "$D/gpu_mem.sh"
TAU=${TAU:-1.36}
DRAFT=$C/Qwen2.5-0.5B-Instruct.config.json

group() {
    local name=$1
    shift
    mem_watch "$name"
    timeout "${LIMIT:-240}" "${BIN:-$D/dustin-bench}" e2e --device cuda --json "$OUT/e2e.jsonl" \
        --accept "default=$TAU" --draft "$DRAFT" --warmup "${WARMUP:-3}" --iters "${ITERS:-6}" ${SYNC:+--sync-phases on} ${ROUNDS:+--rounds $ROUNDS} ${PROFILE:+--profile} --elementwise "${ELEMENTWISE:-fused}" --skinny-gemm "${SKINNY:-on}" --grouped-gemm "${GROUPED:-on}" --fused-residual "${RESIDUAL:-off}" --rope-kv-write "${RKV:-off}" --ragged-accept "${RAGGED:-off}" --kv-write-kernel "${KVWRITE:-on}" --skinny-kernel "${SKMMA:-auto}" ${RING:+--ring-config $RING} --verify-kernel "${VERIFYK:-auto}" "$@" 2>&1 | tee "$OUT/$name.txt"
    echo "{\"group\":\"$name\",\"peak_mib\":$(mem_peak_max "$name")}" | tee -a "$OUT/mem.jsonl"
}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/machine.txt"
case "${1:-7b}" in
grid)
    # the whole grid without the kernel check and the peers (one run of about 9 minutes)
    group 7b_32768 --target "$C/Qwen2.5-7B-Instruct.config.json" --ctx 32768 --batch 1,8,16
    group 72b_32768 --target "$C/Qwen2.5-72B-Instruct.config.json" --target-layers 20 \
        --ctx 32768 --batch 8,16
    group 7b_8192 --target "$C/Qwen2.5-7B-Instruct.config.json" --ctx 8192 --batch 1,8,16
    group 7b_16384 --target "$C/Qwen2.5-7B-Instruct.config.json" --ctx 16384 --batch 1,8,16
    ;;
plot)
    for ctx in 8192 16384 32768; do
        LIMIT=${LIMIT:-150} group "7b_${ctx}_b8" --target "$C/Qwen2.5-7B-Instruct.config.json" \
            --ctx $ctx --batch 8
    done
    ;;
final)
    # 32k: 7B at batch 1 and 8 (every mode), 7B at 16 (ar, dense, dustin), 72B (20 layers) at
    # 8 (ar, dense, dustin, streaming): about 6 minutes (H200, 2026-11-30; `dustin` at B=16
    # needs more than 100 s); HF=1 adds the HF transformers peers at 32k
    LIMIT=${LIMIT_7B:-200} group 7b_32768 --target "$C/Qwen2.5-7B-Instruct.config.json" \
        --ctx 32768 --batch 1,8
    LIMIT=${LIMIT_7B16:-150} group 7b_32768_b16 --target "$C/Qwen2.5-7B-Instruct.config.json" \
        --ctx 32768 --batch 16 --modes ar,dense,dustin
    LIMIT=${LIMIT_72B:-140} group 72b_32768 --target "$C/Qwen2.5-72B-Instruct.config.json" \
        --target-layers 20 --ctx 32768 --batch 8 --modes ar,dense,dustin,streaming
    if [ -n "${HF:-}" ]; then
        PYTHONUNBUFFERED=1 timeout "${HF_LIMIT:-140}" python3 "$D/hf_e2e_bench.py" "$C" --quick 2>&1 | tee "$OUT/hf.jsonl"
    fi
    ;;
verifyk)
    # the verification kernels end to end (one process each, 2 warm-up and 6 timed
    # iterations, ragged acceptance): every verification on the split kernel, on the flash
    # kernel (the 0.5B draft's head_dim 64 too), and `auto` (flash for the 7B target only)
    T7=(--target "$C/Qwen2.5-7B-Instruct.config.json" --ctx 32768 --batch 8
        --modes "${MODES:-ar,dense,dustin}")
    L=${LIMIT:-110}
    for k in ${KERNELS:-split flash auto}; do
        LIMIT=$L RAGGED=on VERIFYK=$k group "7b_verify_$k" "${T7[@]}"
    done
    ;;
s7)
    # ragged acceptance: 7B at 32k, B 1 and 8, and 72B
    # (first 20 of 80 layers) at 32k, B 8; ar, dense, dustin
    LIMIT=${LIMIT_7B:-170} RAGGED=on group 7b_32768 --target "$C/Qwen2.5-7B-Instruct.config.json" \
        --ctx 32768 --batch 1,8 --modes ar,dense,dustin
    LIMIT=${LIMIT_72B:-150} RAGGED=on group 72b_32768 --target "$C/Qwen2.5-72B-Instruct.config.json" \
        --target-layers 20 --ctx 32768 --batch 8 --modes ar,dense,dustin
    ;;
skinny)
    # the skinny GEMMs' default (auto: tensor cores from 2 rows) against `cores` (CUDA
    # cores up to 16 rows, Burn's matmul above), one process each, 7B and
    # 72B (first 20 of 80 layers) at 32k, B=8; ar, dense, dustin
    for k in auto cores; do
        LIMIT=${LIMIT:-100} SKMMA=$k group "7b_32768_b8_$k" --target "$C/Qwen2.5-7B-Instruct.config.json" \
            --ctx 32768 --batch 8 --modes ar,dense,dustin
    done
    for k in auto cores; do
        LIMIT=${LIMIT:-100} SKMMA=$k group "72b_32768_b8_$k" --target "$C/Qwen2.5-72B-Instruct.config.json" \
            --target-layers 20 --ctx 32768 --batch 8 --modes ar,dense,dustin
    done
    ;;
draft)
    # side by side in one process each: the draft's lookahead scored after drafting (the
    # default) and in every step, and a dense draft against one that attends
    # to DRAFT_BUDGETS (default 0,1024) tokens; 7B, 32k, B 8 (BATCH), MODES default
    # dense,dustin
    T7=(--target "$C/Qwen2.5-7B-Instruct.config.json" --ctx 32768 --batch "${BATCH:-8}"
        --modes "${MODES:-dense,dustin}")
    LIMIT=${LIMIT:-200} group 7b_scoring "${T7[@]}" --lookahead-scoring deferred,per-step
    LIMIT=${LIMIT2:-200} group 7b_draft_budget "${T7[@]}" --draft-budget "${DRAFT_BUDGETS:-0,1024}"
    ;;
ab)
    # the `dustin-bench` binary of another commit ($D/dustin-base, staged by hand) against
    # this one, which runs every mode with the fused residual off and on side by side in its
    # process (RESIDUAL=off,on); 7B, 32k, B=8, ar/dense/dustin
    T7=(--target "$C/Qwen2.5-7B-Instruct.config.json" --ctx 32768 --batch 8 --modes "${MODES:-ar,dense,dustin}")
    LIMIT=${LIMIT:-110} BIN=$D/dustin-base group 7b_base "${T7[@]}"
    LIMIT=${LIMIT2:-200} RESIDUAL=off,on group 7b_new "${T7[@]}"
    ;;
prof)
    # every kernel of MODES (default dustin) timed on its own by cubecl's profiler
    # (a sync per kernel, so the run is slower; the summary ranks kernels by total time), and
    # a host profile of the same run; 7B, 32k, B 8
    printf '[profiling.logger]\nlevel = "basic"\nfile = "%s"\n' /tmp/prof.log > cubecl.toml
    LIMIT=${LIMIT:-150} group prof --target "$C/Qwen2.5-7B-Instruct.config.json" --ctx 32768 \
        --batch "${BATCH:-8}" --modes "${MODES:-dustin}" --host-profile "$OUT/host"
    rm -f cubecl.toml
    python3 "$D/profile_summary.py" /tmp/prof.log 45 > "$OUT/prof_summary.txt"
    head -50 "$OUT/prof_summary.txt"
    ;;
selectab)
    # both top-k kernels checked and timed (stage both binaries: `xtask gpu-e2e` and
    # `xtask gpu-kernels`), the dustin fold/mix kernels checked, then 7B, 32k, B 8 (BATCH), dense
    # and dustin with the estimator kernels off/on x the top-k kernel block/warp side by side
    # in one process (dustin+tkb, dustin+tkw, dustin+ek+tkb, dustin+ek+tkw), then dustin with
    # the one-call reuse on and off in another; HOST=1: a host profile of each row in
    # $OUT/host. Shows what each estimator kernel and the top-k kernel gain
    if [ -x "$D/dustin-kernels-gpu" ]; then
        timeout 60 "$D/dustin-kernels-gpu" check --op topk 2>&1 | tee "$OUT/check_topk.txt" | tail -20
        timeout 45 "$D/dustin-kernels-gpu" check --op dustin 2>&1 | tee "$OUT/check_dustin.txt" | tail -8
        timeout 60 "$D/dustin-kernels-gpu" topk --json "$OUT/topk.jsonl" 2>&1 | tee "$OUT/topk.txt"
    fi
    T7=(--target "$C/Qwen2.5-7B-Instruct.config.json" --ctx 32768 --batch "${BATCH:-8}")
    LIMIT=${LIMIT:-240} group 7b_selectab "${T7[@]}" --modes "${MODES:-dense,dustin}" \
        --estimator-kernels off,on --topk-kernel block,warp ${HOST:+--host-profile "$OUT/host"}
    # then the one-call reuse (on by default) against layer
    # by layer, with the default kernels
    LIMIT=${LIMIT2:-180} group 7b_batched "${T7[@]}" --modes dustin --batched-reuse on,off \
        ${HOST:+--host-profile "$OUT/host"}
    ;;
lalayers)
    # `dustin` with its lookahead from all draft layers, every second and the later half
    # (LA, `;`-separated `--lookahead-layers` settings; `half` is the default, the last 12
    # of the 0.5B draft's 24), side by side in one process, phases
    # synced unless SYNC="", 7B at 32k, batch 8, then Qwen2.5-72B shapes (20 of 80 layers) at
    # batch 8 (its summary scales to 80 layers, next to `ar`)
    SYNC=${SYNC-1}
    LA=${LA:-all;stride:2;half}
    LIMIT=${LIMIT:-200} group 7b_lalayers --target "$C/Qwen2.5-7B-Instruct.config.json" \
        --ctx 32768 --batch 8 --modes dense,dustin --lookahead-layers "$LA"
    LIMIT=${LIMIT2:-240} group 72b_lalayers --target "$C/Qwen2.5-72B-Instruct.config.json" \
        --target-layers 20 --ctx 32768 --batch 8 --modes ar,dense,dustin \
        --lookahead-layers "$LA"
    ;;
dropab)
    # `dustin`'s early refresh with and without the noise test
    # (`--accept-drop-sigmas 0,3`, side by side in one process), 7B at 32k, batch 8 (BATCH),
    # then Qwen2.5-72B shapes (20 of 80 layers) at batch 8 and 16, ar / dense / dustin
    LIMIT=${LIMIT:-200} group 7b_dropab --target "$C/Qwen2.5-7B-Instruct.config.json" \
        --ctx 32768 --batch "${BATCH:-8}" --modes dense,dustin --accept-drop-sigmas 0,3
    LIMIT=${LIMIT2:-280} group 72b_dropab --target "$C/Qwen2.5-72B-Instruct.config.json" \
        --target-layers 20 --ctx 32768 --batch 8,16 --modes ar,dense,dustin \
        --accept-drop-sigmas 0,3
    ;;
ab2)
    # the `dustin-bench` binary of another commit ($D/dustin-base, staged by hand) against
    # this one, one process each, default settings; 7B, 32k, B 8, MODES (default
    # dense,dustin)
    T7=(--target "$C/Qwen2.5-7B-Instruct.config.json" --ctx 32768 --batch "${BATCH:-8}" --modes "${MODES:-dense,dustin}")
    LIMIT=${LIMIT:-150} BIN=$D/dustin-base group 7b_base "${T7[@]}"
    LIMIT=${LIMIT2:-150} group 7b_new "${T7[@]}"
    ;;
launch)
    # side by side at 7B, 32k, B 1 and 8 (MODES, default ar,dense,dustin), one
    # process each: the tensor-core skinny GEMM (`mma`), the CUDA-core one (`cores`), the fused
    # residual, then ragged acceptance with Burn's slice-assigns and with the kv_write kernel
    T7=(--target "$C/Qwen2.5-7B-Instruct.config.json" --ctx 32768 --batch 1,8
        --modes "${MODES:-ar,dense,dustin}")
    L=${LIMIT:-100}
    LIMIT=$L SKMMA=mma group 7b_mma "${T7[@]}"
    LIMIT=$L SKMMA=cores group 7b_cores "${T7[@]}"
    LIMIT=$L RESIDUAL=on group 7b_residual "${T7[@]}"
    LIMIT=$L RAGGED=on KVWRITE=off group 7b_ragged "${T7[@]}"
    LIMIT=$L RAGGED=on group 7b_ragged_kvwrite "${T7[@]}"
    ;;
elementwise)
    # the fused RMSNorm / SwiGLU / RoPE / dequantization kernels and the skinny GEMM:
    # checked first, then side by side with the plain Burn ops (7B at 32k, B 1 and 8):
    # plain ops, fused element-wise ops, fused element-wise ops + skinny GEMM
    if ! (set -o pipefail; timeout 330 "$D/dustin-bench" kernel-check --device cuda 2>&1 | tee "$OUT/kernel-check.txt"); then
        echo "kernel-check failed: no timing" >&2
        exit 1
    fi
    # CONFIGS: elementwise:skinny:grouped triples (default: the grouped GEMMs against the
    # per-projection skinny GEMM; plain:off:off and fused:off:off give the plain Burn ops and
    # the fused element-wise kernels without the skinny GEMM)
    for cfg in ${CONFIGS:-fused:on:off fused:on:on}; do
        IFS=: read -r ew sk gr <<<"$cfg"
        ELEMENTWISE=$ew SKINNY=$sk GROUPED=$gr group "7b_32768_${ew}_skinny_${sk}_grouped_${gr}" \
            --target "$C/Qwen2.5-7B-Instruct.config.json" --ctx 32768 --batch 1,8 \
            --modes "${MODES:-ar,dense,dustin}"
    done
    ;;
next)
    # `elementwise` (kernel-check first; stops here when it fails), then `trace`: about 13
    # minutes (kernel-check alone takes 4 on the H200); where one run is limited to less,
    # run the two separately
    LIMIT=${LIMIT:-120} bash "$0" elementwise && bash "$0" trace
    ;;
trace)
    # why `dustin`'s selection costs 246 ms an iteration at B=1 and 78 at B=8 (7B, 32k,
    # docs/perf.md): cubecl's autotune log per batch (keys that change as the context grows
    # would mean re-tuning inside the timed iterations), then a per-kernel trace at B=1
    # (cubecl's profiler, every kernel timed on its own). cubecl reads ./cubecl.toml at start.
    for b in 1 8; do
        printf '[autotune.logger]\nlevel = "full"\nfile = "%s"\n' "$OUT/autotune_b$b.log" > cubecl.toml
        LIMIT=150 group "trace_autotune_b$b" --target "$C/Qwen2.5-7B-Instruct.config.json" \
            --ctx 32768 --batch "$b" --modes dustin
        echo "B=$b: $(grep -c . "$OUT/autotune_b$b.log" 2>/dev/null || echo 0) autotune log lines"
    done
    # the raw profile stays on the machine (only a few files are copied back): its
    # summary and a compressed copy come back
    printf '[profiling.logger]\nlevel = "basic"\nfile = "%s"\n' /tmp/profile_b1.log > cubecl.toml
    LIMIT=200 group trace_profile_b1 --target "$C/Qwen2.5-7B-Instruct.config.json" \
        --ctx 32768 --batch 1 --modes dustin
    rm -f cubecl.toml
    python3 "$D/profile_summary.py" /tmp/profile_b1.log > "$OUT/profile_b1_summary.txt"
    gzip -c /tmp/profile_b1.log > "$OUT/profile_b1.log.gz"
    head -40 "$OUT/profile_b1_summary.txt"
    ;;
where)
    # is a decoding step bound by the GPU's kernels or by the host? (H200, 2026-11-30: the GPU
    # was busy 36-52%, the host threads 65-97%; docs/perf.md). 1) nvidia-smi's utilization.gpu (share of time some
    # kernel runs) every 50 ms while `dense` decodes at B=1, 7B, 32k; 2) every kernel's own GPU
    # time (ncu, one pass of gpu__time_duration) in a small run (7B shapes with 2 layers,
    # 0.5B draft, 4k context, B=1, dense, 3 iterations), timed first without ncu
    nvidia-smi --query-gpu=timestamp,utilization.gpu --format=csv,noheader,nounits -lms 50 > "$OUT/util.txt" 2>/dev/null &
    W=$!
    echo "start $(date +%T.%N)" > "$OUT/util_marks.txt"
    timeout 200 "$D/dustin-bench" e2e --device cuda --accept "default=$TAU" --draft "$DRAFT" \
        --target "$C/Qwen2.5-7B-Instruct.config.json" --ctx 32768 --batch 1 --modes "${MODES:-dense}" \
        --warmup 2 --iters "${ITERS:-80}" 2>&1 | grep "^|" | tee "$OUT/util_run.txt"
    echo "end $(date +%T.%N)" >> "$OUT/util_marks.txt"
    kill $W
    SMALL=(e2e --device cuda --accept "default=$TAU" --draft "$DRAFT" --target
        "$C/Qwen2.5-7B-Instruct.config.json" --target-layers 2 --ctx 4096 --batch 1 --modes dense
        --warmup 1 --iters 3)
    timeout 100 "$D/dustin-bench" "${SMALL[@]}" 2>&1 | grep "^|" | tee "$OUT/small_run.txt"
    timeout 300 ncu --metrics gpu__time_duration.sum --csv --print-units base "$D/dustin-bench" \
        "${SMALL[@]}" > /tmp/ncu.csv 2> "$OUT/ncu_err.txt"
    echo "ncu rc=$? lines $(wc -l < /tmp/ncu.csv)"
    gzip -c /tmp/ncu.csv > "$OUT/ncu.csv.gz"
    ;;
draftncu)
    # every kernel of a speculative iteration, in order, with its own GPU time (ncu, one pass
    # of gpu__time_duration): 7B target (TARGET: another config, e.g. the 72B one) cut to 1
    # layer, 0.5B draft, CTX (32k) context, B (8), `dense`,
    # 1 warm-up and 1 timed iteration, first timed without ncu; launches per draft layer and
    # their GPU time are counted from the CSV by scripts/ncu_steps.py. MODES (default dense)
    # and EXTRA (more e2e flags, e.g. "--draft-budget 1024") pick the run, TAG names it
    SMALL=(e2e --device cuda --accept "default=$TAU" --draft "$DRAFT" --target
        "${TARGET:-$C/Qwen2.5-7B-Instruct.config.json}" --target-layers 1 --ctx "${CTX:-32768}" --batch "${B:-8}"
        --modes "${MODES:-dense}" --warmup 1 --iters "${ITERS:-1}" ${EXTRA:-})
    # TAG names the outputs, so that several traces (MODES, EXTRA) come back from one run
    T=${TAG:-draft}
    timeout 100 "$D/dustin-bench" "${SMALL[@]}" 2>&1 | grep "^|" | tee "$OUT/${T}_small_run.txt"
    timeout "${NCU_LIMIT:-300}" ncu --metrics gpu__time_duration.sum --csv --print-units base \
        "$D/dustin-bench" "${SMALL[@]}" > "/tmp/ncu_$T.csv" 2> "$OUT/${T}_ncu_err.txt"
    echo "ncu rc=$? lines $(wc -l < "/tmp/ncu_$T.csv")"
    python3 "$D/ncu_steps.py" "/tmp/ncu_$T.csv" > "$OUT/${T}_steps.txt"
    head -45 "$OUT/${T}_steps.txt"
    gzip -c "/tmp/ncu_$T.csv" > "$OUT/ncu_$T.csv.gz"
    ;;
hf)
    PYTHONUNBUFFERED=1 timeout "${HF_LIMIT:-540}" python3 "$D/hf_e2e_bench.py" "$C" 2>&1 | tee "$OUT/hf.jsonl"
    ;;
7b)
    # dustin-kernels-gpu is staged by `xtask gpu-kernels`, not `gpu-e2e`
    if [ -x "$D/dustin-kernels-gpu" ]; then
        timeout 120 "$D/dustin-kernels-gpu" check 2>&1 | tee "$OUT/check.txt" | grep -E "row scores|FAIL|fail|pass|ok" | tail -30
    else
        timeout 330 "$D/dustin-bench" kernel-check --device cuda 2>&1 | tee "$OUT/check.txt" | tail -5
    fi
    for ctx in 32768 8192 16384; do
        group "7b_$ctx" --target "$C/Qwen2.5-7B-Instruct.config.json" --ctx "$ctx" --batch 1,8,16
    done
    ;;
72b)
    group 72b_32768 --target "$C/Qwen2.5-72B-Instruct.config.json" --target-layers 20 \
        --ctx 32768 --batch 8,16
    PYTHONUNBUFFERED=1 timeout "${HF_LIMIT:-300}" python3 "$D/hf_e2e_bench.py" "$C" 2>&1 | tee "$OUT/hf.jsonl"
    ;;
run)
    # any one group, `run NAME e2e-args...`
    shift
    name=$1
    shift
    group "$name" "$@"
    ;;
*)
    echo "usage: gpu_e2e.sh 7b|72b|grid|hf|final|elementwise|trace|next|where|prof|selectab|lalayers|dropab|run NAME ARGS..." >&2
    exit 2
    ;;
esac
