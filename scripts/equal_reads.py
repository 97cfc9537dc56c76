#!/usr/bin/env python3
"""Dustin's variants against `draft-only` at the same total KV read, from the `results.jsonl`
of one `dustin eval fidelity` run that holds `draft-only`, `dustin`, `h1r4` and `h1r8` rows.

Per (selector, budget), pooled over the run's sources: the estimation read and the total read
(selected + estimation) as fractions of a dense read (means over sources), top-1 agreement
(agreeing positions over positions) and KL per position; then `draft-only`'s top-1 and KL
interpolated linearly in its total read between the two budgets whose totals bracket the row's
total ("outside the budgets run" where none do).

Usage:
  python3 scripts/equal_reads.py out/fid-cheap-est/results.jsonl > equal_reads.md
"""

import json
import sys


def main():
    rows = [json.loads(line)["value"] for line in open(sys.argv[1])]
    cells = {}
    for r in rows:
        c = cells.setdefault(
            (r["selector"], r["budget"]),
            {"agree": 0, "pos": 0, "kl": 0.0, "sel": 0.0, "est": 0.0, "n": 0},
        )
        c["agree"] += sum(r["win_agree"])
        c["pos"] += r["positions"]
        c["kl"] += sum(r["win_kl"])
        c["sel"] += r["kv_selected"]
        c["est"] += r["kv_estimation"]
        c["n"] += 1
    cell = {
        k: {
            "top1": c["agree"] / c["pos"],
            "kl": c["kl"] / c["pos"],
            "total": (c["sel"] + c["est"]) / c["n"],
            "est": c["est"] / c["n"],
        }
        for k, c in cells.items()
    }
    budgets = sorted({b for _, b in cell})
    reference = sorted(
        (cell[("draft-only", b)]["total"], cell[("draft-only", b)]) for b in budgets
    )

    def at(total, key):
        for (t0, c0), (t1, c1) in zip(reference, reference[1:]):
            if t0 <= total <= t1:
                return c0[key] + (c1[key] - c0[key]) * (total - t0) / (t1 - t0)
        return None

    def fmt(x):
        return "outside the budgets run" if x is None else f"{x:.4f}"

    print(
        "| selector | budget | estimation read | total read | top-1 | KL | `draft-only` at the same total: top-1 | KL |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for s in ["dustin", "h1r4", "h1r8", "draft-only"]:
        for b in budgets:
            c = cell[(s, b)]
            print(
                f"| `{s}` | {b} | {c['est']:.3f} | {c['total']:.3f} | {c['top1']:.4f} | "
                f"{c['kl']:.4f} | {fmt(at(c['total'], 'top1'))} | {fmt(at(c['total'], 'kl'))} |"
            )


if __name__ == "__main__":
    main()
