#!/usr/bin/env python3
"""Summarises a cubecl profiling log (`[profiling.logger] level = "basic"`, lines
`| <duration> | <kernel name>`): total time and launches per kernel, largest first.

Usage: python3 profile_summary.py LOG [TOP]   (on the GPU machine, so that only the summary
has to come back from a device call)."""
import collections
import re
import sys

UNIT_US = {"ns": 1e-3, "µs": 1.0, "us": 1.0, "ms": 1e3, "s": 1e6}


def main() -> None:
    path = sys.argv[1]
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 60
    total = collections.Counter()
    count = collections.Counter()
    pat = re.compile(r"\|\s*([0-9.]+)(ns|µs|us|ms|s)\s*\|\s*(.*)")
    with open(path, errors="replace") as f:
        for line in f:
            m = pat.match(line)
            if not m:
                continue
            us = float(m.group(1)) * UNIT_US[m.group(2)]
            name = m.group(3).strip()[:140]
            total[name] += us
            count[name] += 1
    print(f"total_ms {sum(total.values()) / 1e3:.1f} launches {sum(count.values())}")
    for name, us in total.most_common(top):
        print(f"{us / 1e3:10.1f} ms {count[name]:8d} x {name}")


if __name__ == "__main__":
    main()
