#!/usr/bin/env python3
"""GPU time of the tensor-core skinny GEMM per call, from Nsight Compute's CSV
(`gpu__time_duration.sum`, `--print-units base`: nanoseconds) of one `dustin-kernels-gpu gemm
--decode-only --no-burn --model MODEL` process captured with the kernel filter
`skinny_mma_kernel|skinny_reduce` (`gpu_prefill.sh skinnyktime`).

A call of the tensor-core path is its `skinny_mma_kernel` launches (one per 48 rows) and the
`skinny_reduce_kernel` after them; a reduce with no GEMM launch before it belongs to the
CUDA-core path (its GEMM kernel is not captured) and is skipped. The process runs every shape
(projections q/o, k/v, gate/up, down; rows 1, 8, 16, 40, 128, in that order) 16 times on the
tensor-core path (1 check + 5 warm-up + 10 timed); the last 10 are averaged.

Usage: python3 ncu_skinny.py CSV MODEL   (one JSON line a shape: us per call, GEMM and reduce
parts, TB/s of weight read)."""
import csv
import json
import sys

SHAPES = {"7B": (3584, 18944, 3584, 512), "72B": (8192, 29568, 8192, 1024)}
ROWS = [1, 8, 16, 40, 128]
PER_SHAPE, TIMED = 16, 10


def main() -> None:
    path, model = sys.argv[1], sys.argv[2]
    h, inter, qo, kvo = SHAPES[model]
    with open(path, newline="", errors="replace") as f:
        lines = [l for l in f if l.startswith('"')]
    calls, pending = [], []
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        name = r["Kernel Name"].split("(")[0].strip()
        ns = float(r["Metric Value"].replace(",", ""))
        if name.startswith("skinny_mma_kernel"):
            pending.append(ns)
        elif name.startswith("skinny_reduce"):
            if pending:
                calls.append((sum(pending) / 1e3, ns / 1e3))
            pending = []
    shapes = [(k, n, what, m) for k, n, what in
              [(h, qo, "q/o"), (h, kvo, "k/v"), (h, inter, "gate/up"), (inter, h, "down")]
              for m in ROWS]
    if len(calls) != PER_SHAPE * len(shapes):
        print(json.dumps({"model": model, "error": f"{len(calls)} calls, expected {PER_SHAPE * len(shapes)}"}))
    for i, (k, n, what, m) in enumerate(shapes):
        timed = calls[i * PER_SHAPE:(i + 1) * PER_SHAPE][-TIMED:]
        if len(timed) < TIMED:
            break
        gemm = sum(g for g, _ in timed) / TIMED
        red = sum(r for _, r in timed) / TIMED
        us = gemm + red
        print(json.dumps({"op": "skinny_mma_gpu", "model": model, "proj": what, "m": m, "k": k,
                          "n": n, "gpu_us": round(us, 2), "gemm_us": round(gemm, 2),
                          "reduce_us": round(red, 2), "weight_tbps": round(2 * k * n / us / 1e6, 3)}))


if __name__ == "__main__":
    main()
