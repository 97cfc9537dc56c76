#!/usr/bin/env bash
# Prefill, attention and GEMM kernel measurements, run on the GPU machine from the
# repository root with `.device` carried (`cargo run --release -p xtask -- gpu-e2e`, then
# `-- gpu-kernels`: both binaries fit one carry).
#   bash .device/gpu_prefill.sh kernels  # dustin-kernels-gpu check (prefill rows included);
#                                        # bench --quick of a baseline binary and this one,
#                                        # interleaved (BASE, default .device/dustin-kernels-gpu-base,
#                                        # skipped when absent); gemm (Burn's matmul at prefill and
#                                        # decode shapes, then the prefill attention as in `ttft`);
#                                        # PyTorch on the same shapes
#   bash .device/gpu_prefill.sh ttft     # causal prefill attention alone (dustin-kernels-gpu
#                                        # prefill: our kernel at 4k-32k, the plain path up to
#                                        # 16k, Burn's op at 4k);
#                                        # time to first token at Qwen2.5-7B shapes, 32k prompt:
#                                        # `dustin-bench bench` B=1 (kernel and plain prefill attention),
#                                        # B=8 (kernel); HF transformers `generate` prefill, B=1 and 8
#   bash .device/gpu_prefill.sh blas     # cuBLAS prefill GEMM: element-wise check rows, cuBLAS
#                                        # beside PyTorch, the model rows, TTFT B=1 cuBLAS vs Burn
#   bash .device/gpu_prefill.sh check    # `dustin-bench kernel-check --device cuda` alone (about 4-8
#                                        # minutes on a fresh machine, rows printed per group):
#                                        # add_rms_norm and kv_write rows, then the 2-layer model
#                                        # through every kernel (prefill attention included)
#   bash .device/gpu_prefill.sh flash    # the flash prefill kernel: its check rows (prefill, both
#                                        # kernels forced) against float64; prefill attention at
#                                        # 4k-32k (flash in chunks of 512 and 2048, split, plain,
#                                        # Burn's op) beside PyTorch SDPA
#   bash .device/gpu_prefill.sh ttft2    # time to first token at 7B shapes, 32k: B=1 chunks of 512
#                                        # and 2048, B=8 chunks of 2048 (prefill kernel chosen
#                                        # automatically), then the model rows of kernel-check
#   bash .device/gpu_prefill.sh flashprof # ncu on one flash prefill launch (16k prompt, chunk 512):
#                                        # registers, occupancy, warp stall reasons, pipes
#   bash .device/gpu_prefill.sh verify   # the flash kernel for verification: the whole check (both
#                                        # verification kernels, prefill rows), then bench --quick
#                                        # with the split kernel and the flash kernel, interleaved,
#                                        # two rounds; the prefill attention at 16k
#   bash .device/gpu_prefill.sh final    # one call: the whole kernel check, prefill attention at
#                                        # 16k, the verify bench (flash), the model rows of
#                                        # kernel-check, TTFT at 32k (B=1 and 8, chunks of 2048),
#                                        # then 7B end to end at 32k, B=8, ragged acceptance
#   bash .device/gpu_prefill.sh vbench   # bench --quick: split kernel, flash kernel with 2 and 3
#                                        # tile buffers (ROUNDS rounds, default 1), the draft's
#                                        # decode shape included
#   bash .device/gpu_prefill.sh flashcheck # the check's dense, sparse, prefill and score rows,
#                                        # one op per process
#   bash .device/gpu_prefill.sh checkall # every op of the check, one process per op
#   bash .device/gpu_prefill.sh ktime    # every kernel's own GPU time (Nsight Compute, one pass of
#                                        # gpu__time_duration, clocks not locked, caches flushed
#                                        # before each kernel as in decoding, where each layer
#                                        # reads other KV) of dense, sparse 512/1024/2048 and
#                                        # scoring at B=8, 32k, 7B and 72B: `ktime` processes,
#                                        # summed per call by ncu_ktime.py into ktime.jsonl
#   bash .device/gpu_prefill.sh kprof    # ncu sections (occupancy, stalls, SourceCounters) on one
#                                        # launch of each kernel of KPROF_OPS at 7B, B=8, 32k
#   bash .device/gpu_prefill.sh skinny   # the skinny GEMMs (decode / verify rows 1..128): the
#                                        # element-wise check rows, then gemm --decode-only (ours on
#                                        # CUDA and tensor cores, Burn, cuBLAS) beside PyTorch
#   bash .device/gpu_prefill.sh skinnyktime # the tensor-core skinny GEMM's GPU time per call
#                                        # (ncu) at every decode / verify shape of MODEL
#   bash .device/gpu_prefill.sh model    # the model rows of kernel-check alone (2-layer model through
#                                        # every kernel against its plain path; needs more than 200 s
#                                        # on a fresh machine)
# `dustin-bench bench` prefills in chunks of 16384 on CUDA by default (its automatic chunk); rows
# meant for other chunks say `--chunk N`.
# Env: OUT (results folder).
set -u
D=.device
C=$D/configs
OUT=${OUT:-/tmp/dustin-prefill}
mkdir -p "$OUT"
. "$D/gpu_mem.sh"
BASE=${BASE:-$D/dustin-kernels-gpu-base}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/machine.txt"
case "${1:-kernels}" in
kernels)
    timeout 200 "$D/dustin-kernels-gpu" check 2>&1 | tee "$OUT/check.txt" | grep -E "prefill|FAIL|error|check:" | tail -20
    for round in 1 2; do
        if [ -x "$BASE" ]; then
            timeout 90 "$BASE" bench --quick 2>&1 | sed "s/^/base$round /" | tee -a "$OUT/bench.txt" | grep '^base. | '
        fi
        timeout 90 "$D/dustin-kernels-gpu" bench --quick 2>&1 | sed "s/^/new$round /" | tee -a "$OUT/bench.txt" | grep '^new. | '
    done
    # about 5 minutes: 30 warm-up calls per shape, up to 22 ms each at 32k rows
    timeout 400 "$D/dustin-kernels-gpu" gemm --json "$OUT/gemm.jsonl" > "$OUT/gemm.txt" 2>&1
    echo "gemm rc=$?"
    grep -E 'attention|"m":(4096|32768),' "$OUT/gemm.jsonl" | grep -v skinny
    PYTHONUNBUFFERED=1 timeout 120 python3 "$D/gemm_prefill_bench.py" > "$OUT/torch.jsonl" 2>&1
    echo "torch rc=$?"
    grep -E 'sdpa|"m": (4096|32768),' "$OUT/torch.jsonl"
    ;;
ttft)
    T=$C/Qwen2.5-7B-Instruct.config.json
    if [ -x "$D/dustin-kernels-gpu" ]; then
        timeout 120 "$D/dustin-kernels-gpu" prefill --json "$OUT/prefill.jsonl" > "$OUT/prefill.txt" 2>&1
        echo "prefill rc=$?"
        cat "$OUT/prefill.jsonl"
    fi
    mem_watch b1
    timeout 200 "$D/dustin-bench" bench --device cuda --config "$T" --prompt-len 32768 --batch 1 \
        --decode 8 --warmup 2 --chunk 512 --prefill-attention kernel,plain 2>&1 | tee "$OUT/ttft_b1.txt"
    echo "{\"group\":\"b1\",\"peak_mib\":$(mem_peak_max b1)}" | tee -a "$OUT/mem.jsonl"
    # larger chunks: fewer launches and taller GEMMs
    timeout 100 "$D/dustin-bench" bench --device cuda --config "$T" --prompt-len 32768 --batch 1 \
        --decode 8 --warmup 2 --chunk 2048 --prefill-attention kernel 2>&1 | tee "$OUT/ttft_b1_c2048.txt"
    mem_watch b8
    timeout 150 "$D/dustin-bench" bench --device cuda --config "$T" --prompt-len 32768 --batch 8 \
        --decode 8 --warmup 2 --chunk 512 --prefill-attention kernel 2>&1 | tee "$OUT/ttft_b8.txt"
    echo "{\"group\":\"b8\",\"peak_mib\":$(mem_peak_max b8)}" | tee -a "$OUT/mem.jsonl"
    PYTHONUNBUFFERED=1 timeout 150 python3 "$D/hf_e2e_bench.py" "$C" --quick --ttft 2>&1 | tee "$OUT/hf_ttft.jsonl"
    ;;
blas)
    # where libcublas is, then the element-wise rows (prefill_gemm = cuBLAS, add_rms_norm,
    # kv_write) against float64; cuBLAS at 7B / 72B projection shapes beside PyTorch; the
    # 2-layer model through every kernel (its 300-token prompt takes cuBLAS); time to first
    # token at 7B shapes, 32k, B=1, with cuBLAS and with Burn's matmul
    ls /usr/local/cuda/lib64/ 2>/dev/null | grep -i cublas | tee "$OUT/cublas_libs.txt"
    ldconfig -p 2>/dev/null | grep -i cublas | tee -a "$OUT/cublas_libs.txt"
    timeout 150 "$D/dustin-kernels-gpu" check --op elementwise 2>&1 | tee "$OUT/check_elementwise.txt" | tail -40
    timeout 120 "$D/dustin-kernels-gpu" gemm --no-burn --json "$OUT/cublas.jsonl" > "$OUT/cublas.txt" 2>&1
    echo "cublas rc=$?"
    grep -E '"m":(8|128|4096|32768),' "$OUT/cublas.jsonl"
    PYTHONUNBUFFERED=1 timeout 120 python3 "$D/gemm_prefill_bench.py" > "$OUT/torch.jsonl" 2>&1
    echo "torch rc=$?"
    grep -E '"m": (8|128|4096|32768),' "$OUT/torch.jsonl" | grep -v sdpa
    printf '[autotune]\nlevel = "minimal"\n' > cubecl.toml
    timeout 230 "$D/dustin-bench" kernel-check --device cuda --model-only 2>&1 | tee "$OUT/model-check.txt" | tail -8
    rm -f cubecl.toml
    timeout 150 "$D/dustin-bench" bench --device cuda --config "$C/Qwen2.5-7B-Instruct.config.json" \
        --prompt-len 32768 --batch 1 --decode 8 --warmup 2 --chunk 512 --prefill-gemm cublas,burn 2>&1 | tee "$OUT/ttft_b1.txt"
    timeout 60 "$D/dustin-bench" bench --device cuda --config "$C/Qwen2.5-7B-Instruct.config.json" \
        --prompt-len 32768 --batch 1 --decode 8 --warmup 2 --chunk 2048 2>&1 | tee "$OUT/ttft_b1_c2048.txt"
    ;;
flash)
    timeout 150 "$D/dustin-kernels-gpu" check --op prefill 2>&1 | tee "$OUT/check_prefill.txt" | tail -12
    timeout 240 "$D/dustin-kernels-gpu" prefill --json "$OUT/prefill.jsonl" > "$OUT/prefill.txt" 2>&1
    echo "prefill rc=$?"
    cat "$OUT/prefill.jsonl"
    PYTHONUNBUFFERED=1 timeout 90 python3 "$D/gemm_prefill_bench.py" --sdpa-only 2>&1 | tee "$OUT/torch.jsonl"
    ;;
verify)
    timeout 300 "$D/dustin-kernels-gpu" check 2>&1 | tee "$OUT/check.txt" | grep -E "dense|sparse|prefill|FAIL|error|check:" | tail -40
    for round in 1 2; do
        for kern in split flash; do
            timeout 90 "$D/dustin-kernels-gpu" bench --quick --verify-kernel $kern 2>&1 | sed "s/^/$kern$round /" | tee -a "$OUT/bench.txt" | grep -E "^$kern. \| [0-9]"
        done
    done
    timeout 60 "$D/dustin-kernels-gpu" prefill --quick 2>&1 | tee "$OUT/prefill_quick.txt" | grep flash
    ;;
final)
    T=$C/Qwen2.5-7B-Instruct.config.json
    timeout 170 "$D/dustin-kernels-gpu" check 2>&1 | tee "$OUT/check.txt" | grep -E "FAIL|error|check:" | tail -8
    timeout 45 "$D/dustin-kernels-gpu" prefill --quick 2>&1 | tee "$OUT/prefill_quick.txt" | grep -E "flash|split"
    timeout 60 "$D/dustin-kernels-gpu" bench --quick --verify-kernel flash 2>&1 | tee "$OUT/bench.txt" | grep -E "^\| [0-9]"
    printf '[autotune]\nlevel = "minimal"\n' > cubecl.toml
    timeout 200 "$D/dustin-bench" kernel-check --device cuda --model-only 2>&1 | tee "$OUT/model-check.txt" | tail -8
    rm -f cubecl.toml
    timeout 40 "$D/dustin-bench" bench --device cuda --config "$T" --prompt-len 32768 --batch 1 \
        --decode 8 --warmup 2 --chunk 2048 2>&1 | tee "$OUT/ttft_b1_c2048.txt" | tail -1
    timeout 60 "$D/dustin-bench" bench --device cuda --config "$T" --prompt-len 32768 --batch 8 \
        --decode 8 --warmup 2 --chunk 2048 2>&1 | tee "$OUT/ttft_b8_c2048.txt" | tail -1
    timeout "${E2E_LIMIT:-90}" "$D/dustin-bench" e2e --device cuda --accept default=1.36 \
        --draft "$C/Qwen2.5-0.5B-Instruct.config.json" --target "$T" --ctx 32768 --batch 8 \
        --modes ar,dense,dustin --ragged-accept on --warmup 1 --iters 4 2>&1 | tee "$OUT/e2e_b8.txt" | tail -12
    ;;
flashprof)
    timeout 200 ncu --kernel-name regex:flash_prefill --launch-skip 20 --launch-count 1 \
        --section LaunchStats --section Occupancy --section WarpStateStats \
        --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section SpeedOfLight \
        "$D/dustin-kernels-gpu" prefill --quick > "$OUT/ncu_flash.txt" 2>&1
    echo "ncu rc=$?"
    grep -E "Registers|Achieved Occupancy|Theoretical Occupancy|Block Limit|Duration|Stall|Warp Cycles|Issue Slot|Throughput|Shared Memory Config|Dynamic Shared|Static Shared" "$OUT/ncu_flash.txt" | head -60
    ;;
ttft2)
    T=$C/Qwen2.5-7B-Instruct.config.json
    mem_watch b1
    timeout 100 "$D/dustin-bench" bench --device cuda --config "$T" --prompt-len 32768 --batch 1 \
        --decode 8 --warmup 2 --chunk 512 2>&1 | tee "$OUT/ttft_b1.txt" | tail -4
    timeout 100 "$D/dustin-bench" bench --device cuda --config "$T" --prompt-len 32768 --batch 1 \
        --decode 8 --warmup 2 --chunk 2048 2>&1 | tee "$OUT/ttft_b1_c2048.txt" | tail -4
    echo "{\"group\":\"b1\",\"peak_mib\":$(mem_peak_max b1)}" | tee -a "$OUT/mem.jsonl"
    mem_watch b8
    timeout 150 "$D/dustin-bench" bench --device cuda --config "$T" --prompt-len 32768 --batch 8 \
        --decode 8 --warmup 2 --chunk 2048 2>&1 | tee "$OUT/ttft_b8_c2048.txt" | tail -4
    echo "{\"group\":\"b8\",\"peak_mib\":$(mem_peak_max b8)}" | tee -a "$OUT/mem.jsonl"
    printf '[autotune]\nlevel = "minimal"\n' > cubecl.toml
    timeout 200 "$D/dustin-bench" kernel-check --device cuda --model-only 2>&1 | tee "$OUT/model-check.txt" | tail -8
    rm -f cubecl.toml
    ;;
vbench)
    # bench --quick (7B, 72B and the 0.5B draft's decode shape) with the split kernel and the
    # flash kernel with rings of 2 and 3 tile buffers, interleaved (ROUNDS, default 1)
    for round in $(seq 1 "${ROUNDS:-1}"); do
        for kern in split flash2 flash3; do
            case $kern in
            split) args=(--verify-kernel split) ;;
            flash2) args=(--verify-kernel flash --flash-buffers 2) ;;
            flash3) args=(--verify-kernel flash --flash-buffers 3) ;;
            esac
            timeout 90 "$D/dustin-kernels-gpu" bench --quick "${args[@]}" 2>&1 | sed "s/^/$kern-$round /" | tee -a "$OUT/bench.txt" | grep -E "^$kern-$round \| [0-9a-zA-Z]"
        done
    done
    ;;
flashcheck)
    # the attention rows of the check, one op at a time (each its own process, so a limit cuts
    # one group only): dense and sparse verification on every kernel variant, prefill
    for op in dense sparse prefill scores; do
        timeout "${CHECK_LIMIT:-120}" "$D/dustin-kernels-gpu" check --op $op 2>&1 | tee -a "$OUT/check.txt" | grep -E "FAIL|error|check:"
    done
    ;;
checkall)
    # every op of the check, one process per op (the whole check in one process took more
    # than 240 s on 2026-12-01): a limit cuts one group only
    for op in dense sparse prefill scores quest topk elementwise; do
        timeout "${CHECK_LIMIT:-150}" "$D/dustin-kernels-gpu" check --op $op 2>&1 | tee -a "$OUT/check.txt" | grep -E "FAIL|error|check:"
    done
    ;;
kprof)
    # ncu's sections on one launch of each kernel of KPROF_OPS (default: score sparse1024) at
    # 7B, B=8, 32k (the third call's, after two warm-up calls of two kernels each);
    # SourceCounters lists the most-stalled source lines (cubecl compiles with -lineinfo)
    for op in ${KPROF_OPS:-score sparse1024}; do
        timeout 120 ncu --launch-skip 4 --launch-count 2 --clock-control none \
            --kernel-name regex:'flash_kernel|combine_kernel|score_reduce_kernel' \
            --section LaunchStats --section Occupancy --section WarpStateStats \
            --section MemoryWorkloadAnalysis --section SpeedOfLight --section SourceCounters \
            "$D/dustin-kernels-gpu" ktime --op $op > "$OUT/kprof_$op.txt" 2>&1
        grep -E "^  [a-z_]+kernel|Registers Per|Achieved Occupancy|Block Limit Reg|Block Limit Shared|Duration|DRAM Throughput|Memory Throughput|Compute \(SM\) Th|Warp Cycles Per Issued|Stall" "$OUT/kprof_$op.txt" | head -40
    done
    ;;
ktime)
    # OPS, MODELS: which (default all); EXTRA: more arguments of ktime (e.g. --sparse-waves 4),
    # added to each label
    for model in ${MODELS:-7B 72B}; do
        for op in ${OPS:-dense sparse512 sparse1024 sparse2048 score}; do
            timeout 120 ncu --metrics gpu__time_duration.sum --csv --print-units base \
                --clock-control none --cache-control all \
                --kernel-name regex:'flash_kernel|split_kernel|combine_kernel|score_reduce_kernel' \
                "$D/dustin-kernels-gpu" ktime --op $op --model $model ${EXTRA:-} > /tmp/ktime.csv 2>> "$OUT/ktime_err.txt"
            python3 "$D/ncu_ktime.py" /tmp/ktime.csv "$model $op ${EXTRA:-}" | tee -a "$OUT/ktime.jsonl"
        done
    done
    ;;
skinny)
    # the skinny GEMMs (decode / verify rows 1..128): the element-wise check (skinny rows on
    # both kernels), then ours (CUDA cores, tensor cores), Burn's matmul and cuBLAS beside
    # PyTorch on the same shapes
    timeout "${CHECK_LIMIT:-240}" "$D/dustin-kernels-gpu" check --op elementwise 2>&1 | tee "$OUT/check_elementwise.txt" | grep -E "FAIL|error|check:|skinny|swiglu"
    timeout 300 "$D/dustin-kernels-gpu" gemm --decode-only --json "$OUT/gemm_decode.jsonl" > "$OUT/gemm_decode.txt" 2>&1
    echo "gemm rc=$?"
    PYTHONUNBUFFERED=1 timeout 120 python3 "$D/gemm_prefill_bench.py" --decode-only > "$OUT/torch_decode.jsonl" 2>&1
    echo "torch rc=$?"
    ;;
skinnyprof)
    # ncu sections on single skinny-GEMM launches of `gemm --decode-only --no-burn --model 7B`
    # (gate/up: the tensor-core kernel at 8 and 40 rows, the CUDA-core one at 1 row), and the
    # tensor-core kernel's generated CUDA source (cubecl's compilation log). Launch counts:
    # each shape is 16 calls; a tensor-core call is one launch per 48 rows (3 at 128), so a
    # projection is 4 x 16 + 48 = 112 launches and gate/up's 8 and 40 rows start at 240 and
    # 272; the CUDA-core kernel runs 1, 8 and 16 rows (48 launches a projection)
    printf '[compilation.logger]\nlevel = "full"\nfile = "/tmp/cubecl-src.log"\n' > cubecl.toml
    for spec in "skinny_mma_kernel 247 mma_m8" "skinny_mma_kernel 279 mma_m40" "skinny_gemm_kernel 100 cores_m1"; do
        set -- $spec
        timeout 150 ncu --kernel-name regex:$1 --launch-skip $2 --launch-count 1 --clock-control none \
            --section LaunchStats --section Occupancy --section WarpStateStats \
            --section MemoryWorkloadAnalysis --section SpeedOfLight --section SourceCounters \
            "$D/dustin-kernels-gpu" gemm --decode-only --no-burn --model 7B > "$OUT/prof_$3.txt" 2>&1
        grep -E "Registers Per|Achieved Occupancy|Block Limit|Duration|DRAM Throughput|Warp Cycles Per Issued|Local Memory|Stall" "$OUT/prof_$3.txt" | head -24
    done
    rm -f cubecl.toml
    python3 - <<'EOF' > "$OUT/skinny_mma_src.cu"
import re
s = open("/tmp/cubecl-src.log", errors="replace").read()
i = s.find("skinny_mma_kernel")
print(s[max(0, s.rfind("\n\n", 0, i)):i + 30000] if i >= 0 else "not found")
EOF
    ;;
skinnyktime)
    # the tensor-core skinny GEMM's own GPU time (ncu, one pass of gpu__time_duration, caches
    # flushed) at every decode / verify shape of MODEL (default 7B): the kernel and its split
    # reduction per call, summed by ncu_skinny.py
    timeout 200 ncu --metrics gpu__time_duration.sum --csv --print-units base \
        --clock-control none --cache-control all \
        --kernel-name regex:'skinny_mma_kernel|skinny_reduce' \
        "$D/dustin-kernels-gpu" gemm --decode-only --no-burn --model "${MODEL:-7B}" > /tmp/skt.csv 2> "$OUT/skinnyktime_err.txt"
    python3 "$D/ncu_skinny.py" /tmp/skt.csv "${MODEL:-7B}" | tee "$OUT/skinnyktime.jsonl"
    ;;
model)
    printf '[autotune]\nlevel = "minimal"\n' > cubecl.toml
    timeout 330 "$D/dustin-bench" kernel-check --device cuda --model-only 2>&1 | tee "$OUT/model-check.txt" | tail -10
    rm -f cubecl.toml
    ;;
check)
    # cubecl's autotune at `minimal`: the plain path's matmuls of the model rows otherwise
    # autotune every new shape (more than 3 minutes on a fresh machine); values are the same
    printf '[autotune]\nlevel = "minimal"\n' > cubecl.toml
    timeout 540 "$D/dustin-bench" kernel-check --device cuda 2>&1 | tee "$OUT/kernel-check.txt" | tail -25
    rm -f cubecl.toml
    ;;
*)
    echo "usage: gpu_prefill.sh kernels|ttft|blas|check|flash|flashprof|ttft2|verify|vbench|flashcheck|checkall|kprof|ktime|skinny|skinnyprof|skinnyktime|final|model" >&2
    exit 2
    ;;
esac
