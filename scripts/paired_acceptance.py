#!/usr/bin/env python3
"""Acceptance length of each selector against dense verification on the same prompts, pooled
over the sources of one `dustin eval acceptance` run (its `results.jsonl`).

Per mode: the sources it ran on (all of dense's, else marked incomplete), its verifications,
its pooled acceptance length (tokens over verifications), that length over dense's on the same
sources with a 95% percentile interval from a bootstrap over sources (2000 resamples, seed 0;
both modes resample the same sources, so the pairing is kept), and the median over sources of
the first output token where it leaves dense's output (64 of 64: never).

Usage:
  python3 scripts/paired_acceptance.py out/acceptance/results.jsonl > paired.md
"""

import json
import random
import sys


def main():
    rows = [json.loads(line)["value"] for line in open(sys.argv[1])]
    by = {}
    for r in rows:
        if r["mode"] == "autoregressive":
            continue
        key = r["mode"] if r["mode"] == "dense" else f"{r['selector']}@{r['budget_tokens']}"
        by.setdefault(key, {})[r["source"]] = r
    dense = by["dense"]
    sources = sorted(dense)

    def pooled(mode, ss):
        tokens = sum(len(by[mode][s]["accepted"]) + sum(by[mode][s]["accepted"]) for s in ss)
        verifications = sum(len(by[mode][s]["accepted"]) for s in ss)
        return tokens / verifications

    rng = random.Random(0)
    print(
        "| mode | sources | verifications | acceptance length | vs dense [95% CI, bootstrap over sources] | first token off dense (median) |"
    )
    print("|---|---:|---:|---:|---|---:|")
    for mode in ["dense"] + sorted(k for k in by if k != "dense"):
        ss = [s for s in sources if s in by[mode]]
        if len(ss) < len(sources):
            print(f"| {mode} | {len(ss)} of {len(sources)} (incomplete) | | | | |")
            continue
        a, d = pooled(mode, ss), pooled("dense", ss)
        boots = []
        for _ in range(2000):
            pick = [rng.choice(ss) for _ in ss]
            boots.append(pooled(mode, pick) / pooled("dense", pick))
        boots.sort()
        lo, hi = boots[int(0.025 * len(boots))], boots[int(0.975 * len(boots)) - 1]
        n = sum(len(by[mode][s]["accepted"]) for s in ss)
        offs = []
        for s in ss:
            out, ref = by[mode][s]["output"], dense[s]["output"]
            offs.append(next((i for i, (x, y) in enumerate(zip(out, ref)) if x != y), min(len(out), len(ref))))
        offs.sort()
        print(f"| {mode} | {len(ss)} | {n} | {a:.2f} | {a / d:.3f} [{lo:.3f}, {hi:.3f}] | {offs[len(offs) // 2]} |")


if __name__ == "__main__":
    main()
