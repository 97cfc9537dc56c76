"""Load generator for `dustin serve`: N concurrent streamed completions (the official `openai`
client, one thread per request) against the same requests run one at a time, with
throughput, time to first token, inter-token latency and the server's own time per token
(from `/metrics`).

    python scripts/serve_load.py --base http://127.0.0.1:8080 --model MODEL_ID \
        --concurrency 1,4,16 --prompt-tokens 256 --max-tokens 32 [--json out.json]

Prompts are slices of this repository's Rust sources, about `--prompt-tokens` tokens each
(the mean the server counted is reported). Every request is greedy with `max_tokens` new
tokens. For each N the first N requests run at once; the baseline runs the first
`--sequential` of them (default: the largest N) one after another. A streamed chunk holds the text of one engine iteration (several tokens
after a speculative iteration): the inter-token latency gives each token of a chunk the
gap to the request's previous chunk divided by the chunk's tokens, a request's tokens
(the server's count over the requests) apportioned to its chunks by characters. The
server's time per token splits the wall time into the engine's model time (prefill and
decoding steps), its scheduling (busy time around them) and the time outside the engine
(HTTP, tokenization, queueing, idle), from the `/metrics` counters.
"""

import argparse
import json
import sys
import threading
import time
import urllib.request
from pathlib import Path

from openai import OpenAI

GAUGES = ("dustin_active_sequences", "dustin_queue_depth")

METRICS = (
    "dustin_completion_tokens_total",
    "dustin_prompt_tokens_total",
    "dustin_decode_tokens_total",
    "dustin_decode_seconds_total",
    "dustin_prefill_seconds_total",
    "dustin_engine_busy_seconds_total",
)


def metrics(base: str) -> dict:
    text = urllib.request.urlopen(f"{base}/metrics", timeout=30).read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or " " not in line:
            continue
        name, value = line.rsplit(" ", 1)
        if name in METRICS or name in GAUGES:
            out[name] = float(value)
    return out


def idle_metrics(base: str) -> dict:
    """The counters once the engine has counted its last round (it updates its busy time
    after the round in which the last request ended)."""
    for _ in range(200):
        m = metrics(base)
        if all(m.get(g, 0.0) == 0.0 for g in GAUGES):
            return m
        time.sleep(0.05)
    return metrics(base)


def prompts(n: int, tokens: int) -> list:
    """`n` slices of the repository's Rust sources of about `tokens` tokens (code runs about
    3.3 characters a token with the Qwen2.5 tokenizer)."""
    root = Path(__file__).resolve().parent.parent / "crates"
    text = "\n".join(p.read_text() for p in sorted(root.glob("*/src/**/*.rs")))
    size = int(tokens * 3.3)
    step = max(size, len(text) // max(n, 1))
    return [text[i * step : i * step + size] for i in range(n)]


def one(client: OpenAI, model: str, prompt: str, max_tokens: int, t0: float) -> dict:
    """One streamed completion: arrival times of its chunks and their texts."""
    start = time.perf_counter()
    chunks = []
    finish = None
    for c in client.completions.create(
        model=model, prompt=prompt, max_tokens=max_tokens, temperature=0, stream=True
    ):
        for ch in c.choices:
            if ch.text:
                chunks.append((time.perf_counter(), ch.text))
            finish = ch.finish_reason or finish
    end = time.perf_counter()
    return {"start": start - t0, "end": end - t0, "chunks": [(t - t0, s) for t, s in chunks],
            "finish": finish}


def run(client, base, model, batch, max_tokens, concurrent: bool) -> dict:
    before = idle_metrics(base)
    t0 = time.perf_counter()
    results = [None] * len(batch)
    if concurrent:
        def go(i):
            results[i] = one(client, model, batch[i], max_tokens, t0)
        threads = [threading.Thread(target=go, args=(i,)) for i in range(len(batch))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    else:
        for i, p in enumerate(batch):
            results[i] = one(client, model, p, max_tokens, t0)
    wall = time.perf_counter() - t0
    after = idle_metrics(base)
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in METRICS}
    tokens = d["dustin_completion_tokens_total"]
    ttft, itl = [], []
    for r in results:
        if not r["chunks"]:
            continue
        ttft.append(r["chunks"][0][0] - r["start"])
        # tokens of the request after its first: shared by its later chunks by characters
        later = r["chunks"][1:]
        chars = sum(len(s) for _, s in later) or 1
        req_tokens = tokens / len(results)
        prev = r["chunks"][0][0]
        for t, s in later:
            k = max(1, round((req_tokens - 1) * len(s) / chars))
            itl.extend([(t - prev) / k] * k)
            prev = t
    model_secs = d["dustin_decode_seconds_total"] + d["dustin_prefill_seconds_total"]
    busy = d["dustin_engine_busy_seconds_total"]
    return {
        "requests": len(batch),
        "concurrent": concurrent,
        "wall_s": wall,
        "tokens": tokens,
        "prompt_tokens_mean": d["dustin_prompt_tokens_total"] / len(batch),
        "tokens_per_s": tokens / wall,
        "ttft_p50_s": pct(ttft, 50),
        "ttft_p99_s": pct(ttft, 99),
        "itl_p50_ms": 1e3 * pct(itl, 50),
        "itl_p99_ms": 1e3 * pct(itl, 99),
        "engine_model_ms_per_token": 1e3 * model_secs / max(tokens, 1),
        "engine_sched_ms_per_token": 1e3 * (busy - model_secs) / max(tokens, 1),
        "outside_engine_ms_per_token": 1e3 * (wall - busy) / max(tokens, 1),
        "finish": sorted({r["finish"] for r in results}),
    }


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default="http://127.0.0.1:8080")
    ap.add_argument("--model", required=True)
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--sequential", type=int, default=0,
                    help="requests of the one-at-a-time baseline (default: the largest N)")
    ap.add_argument("--label", default="")
    ap.add_argument("--json", help="append the rows to this JSON-lines file")
    a = ap.parse_args()
    ns = [int(x) for x in a.concurrency.split(",")]
    client = OpenAI(base_url=f"{a.base}/v1", api_key="unused", timeout=3600, max_retries=0)
    reqs = prompts(max(ns), a.prompt_tokens)
    # warm-up: one short request (first-call allocations), not measured
    client.completions.create(model=a.model, prompt=reqs[0][:200], max_tokens=2, temperature=0)
    seq = a.sequential or max(ns)
    rows = [run(client, a.base, a.model, reqs[:seq], a.max_tokens, concurrent=False)]
    rows[0]["label"] = f"{a.label} one at a time x{seq}"
    for n in ns:
        r = run(client, a.base, a.model, reqs[:n], a.max_tokens, concurrent=True)
        r["label"] = f"{a.label} N={n}"
        rows.append(r)
    cols = ["label", "wall_s", "tokens", "tokens_per_s", "ttft_p50_s", "ttft_p99_s",
            "itl_p50_ms", "itl_p99_ms", "engine_model_ms_per_token",
            "engine_sched_ms_per_token", "outside_engine_ms_per_token", "prompt_tokens_mean"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(
            r[c] if isinstance(r[c], str) else f"{r[c]:.3g}" for c in cols) + " |")
    sys.stdout.flush()
    if a.json:
        with open(a.json, "a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
