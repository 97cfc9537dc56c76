#!/usr/bin/env python3
"""Kernels of one `dustin-bench e2e` process in launch order, from Nsight Compute's CSV
(`gpu__time_duration.sum`, `--print-units base`: nanoseconds), as captured by
`gpu_e2e.sh draftncu`.

Prints the number of kernels and their summed GPU time, a histogram by kernel name (launches,
GPU us), and the launch sequence run-length encoded by name (`name xN (us)`), so that a draft
step's 24 layers show up as a repeated block of names.

With `--range A:B` it prints only the histogram of launches A to B-1 (launch numbers as in
the run-length list), by kernel name and grid: one proposal or one layer's share.

Usage: python3 ncu_steps.py CSV [--range A:B]"""
import collections
import csv
import gzip
import sys


def main() -> None:
    rng = None
    if len(sys.argv) == 4 and sys.argv[2] == "--range":
        a, b = sys.argv[3].split(":")
        rng = (int(a), int(b))
    opener = gzip.open if sys.argv[1].endswith(".gz") else open
    with opener(sys.argv[1], "rt", newline="", errors="replace") as f:
        lines = [l for l in f if l.startswith('"')]
    seq = []
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        name = r["Kernel Name"].split("(")[0].split("<")[0].strip()
        seq.append((name, r.get("Grid Size", ""), float(r["Metric Value"].replace(",", "")) / 1e3))
    if rng is not None:
        part = seq[rng[0] : rng[1]]
        print(f"launches {rng[0]} to {rng[1] - 1}: {len(part)}, GPU time {sum(us for *_, us in part) / 1e3:.2f} ms")
        hist = collections.defaultdict(lambda: [0, 0.0])
        for name, grid, us in part:
            hist[(name, grid)][0] += 1
            hist[(name, grid)][1] += us
        print("| kernel | grid | launches | GPU us |")
        print("|---|---|---:|---:|")
        for (name, grid), (n, us) in sorted(hist.items(), key=lambda kv: -kv[1][1]):
            print(f"| {name} | {grid} | {n} | {us:.1f} |")
        return
    print(f"kernels {len(seq)}, GPU time {sum(us for *_, us in seq) / 1e3:.2f} ms")
    by = collections.defaultdict(lambda: [0, 0.0])
    for name, _, us in seq:
        by[name][0] += 1
        by[name][1] += us
    print("| kernel | launches | GPU us |")
    print("|---|---:|---:|")
    for name, (n, us) in sorted(by.items(), key=lambda kv: -kv[1][0]):
        print(f"| {name} | {n} | {us:.1f} |")
    print("\nlaunch order (run-length encoded):")
    i = 0
    while i < len(seq):
        j = i
        while j < len(seq) and seq[j][0] == seq[i][0] and seq[j][1] == seq[i][1]:
            j += 1
        us = sum(s[2] for s in seq[i:j])
        print(f"{i} {seq[i][0]} {seq[i][1]} x{j - i} ({us:.1f} us)")
        i = j


if __name__ == "__main__":
    main()
