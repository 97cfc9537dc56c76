#!/usr/bin/env python3
"""Sums Nsight Compute's per-kernel GPU time (`gpu__time_duration.sum`, CSV, `--print-units
base`, so nanoseconds) over the last TIMED (5) of the CALLS (7) calls of one
`dustin-kernels-gpu ktime` process.

The process makes 2 warm-up calls and then 5 timed ones, so the captured kernels (filtered by
name in `gpu_prefill.sh ktime`) split into 7 equal calls; the last 5 are summed per call.

Usage: python3 ncu_ktime.py CSV LABEL   (prints one JSON line: label, kernels per call, GPU us
per call, and the mean of each kernel's time)."""
import collections
import csv
import json
import sys

CALLS = 7
TIMED = 5


def main() -> None:
    path, label = sys.argv[1], sys.argv[2]
    rows = []
    with open(path, newline="", errors="replace") as f:
        lines = [l for l in f if l.startswith('"')]
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        rows.append((r["Kernel Name"].split("(")[0].strip(), float(r["Metric Value"].replace(",", ""))))
    if not rows or len(rows) % CALLS:
        print(json.dumps({"label": label, "error": f"{len(rows)} kernels, not a multiple of {CALLS}"}))
        return
    per = len(rows) // CALLS
    timed = rows[-TIMED * per:]
    calls = [sum(ns for _, ns in timed[i * per:(i + 1) * per]) / 1e3 for i in range(TIMED)]
    by = collections.defaultdict(list)
    for name, ns in timed:
        by[name].append(ns / 1e3)
    print(json.dumps({
        "label": label,
        "kernels_per_call": per,
        "gpu_us_per_call": round(sum(calls) / TIMED, 2),
        "gpu_us_min": round(min(calls), 2),
        "by_kernel_us": {k: round(sum(v) / TIMED, 2) for k, v in by.items()},
    }))


if __name__ == "__main__":
    main()
