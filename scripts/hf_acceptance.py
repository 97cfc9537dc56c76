#!/usr/bin/env python3
"""Greedy speculative decoding of the Qwen2.5-Coder pair in HF transformers: the reference for
the dense rows of `dustin eval acceptance`.

Reads the prompts `dustin eval acceptance` wrote (`<out>/prompts/<source>.ctx<N>.json`, token
ids), loads draft and target from the same GGUF files (transformers dequantises them to
float32), and for each prompt and gamma runs greedy speculative decoding with dense
verification: the draft proposes gamma tokens greedily, the target scores the pending token
and the proposals in one forward pass, the longest prefix of proposals equal to the target's
greedy choices is accepted and the target's next choice appended (accepted + 1 tokens per
verification). Prints one JSON line per (prompt, gamma): mean acceptance length, iterations,
tokens, and whether the output equals the target's greedy output (computed by the same loop's
target, token by token); appends them to `<out>/hf_acceptance.jsonl`.

Usage:
  python3 scripts/hf_acceptance.py --out out/acceptance [--gamma 4] [--new-tokens 64]
      [--cache ~/.cache/dustin] [--prompts PATTERN]

Needs `pip install -r scripts/requirements.txt`. Memory: about 9 GB (both models in float32).
"""

import argparse
import json
import os
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, DynamicCache

TARGET = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
DRAFT = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"


def load(path: Path):
    return AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32, attn_implementation="sdpa"
    ).eval()


@torch.no_grad()
def crop(cache, keep):
    """Drops the cache's entries past the first `keep` positions (transformers 5 takes the
    number to drop as a negative count)."""
    drop = cache.get_seq_length() - keep
    if drop > 0:
        cache.crop(-drop)


@torch.no_grad()
def forward(model, ids, cache):
    out = model(torch.tensor([ids]), past_key_values=cache, use_cache=True)
    return out.logits[0]


@torch.no_grad()
def speculative(target, draft, prompt, gamma, new_tokens, eos):
    tc, dc = DynamicCache(), DynamicCache()
    logits = forward(target, prompt, tc)
    seq = list(prompt)
    seq.append(int(logits[-1].argmax()))  # the first token comes from the prefill
    forward(draft, prompt, dc)
    d_len = len(prompt)  # tokens in the draft's cache
    t_len = len(prompt)  # tokens in the target's cache
    lens = []
    while len(seq) - len(prompt) < new_tokens and seq[-1] not in eos:
        # the draft catches up on the tokens it has not seen, then proposes gamma tokens
        props = []
        feed = seq[d_len:]
        for _ in range(gamma):
            lg = forward(draft, feed, dc)
            d_len += len(feed)
            props.append(int(lg[-1].argmax()))
            feed = [props[-1]]
        # the target scores the pending token and the proposals
        lg = forward(target, [seq[-1]] + props, tc)
        choice = [int(x) for x in lg.argmax(-1)]
        a = 0
        while a < gamma and props[a] == choice[a]:
            a += 1
        emitted = props[:a] + [choice[a]]
        lens.append(a + 1)
        t_len += 1 + a
        crop(tc, t_len)
        seq.extend(emitted)
        d_len = min(d_len, len(seq) - 1)
        crop(dc, d_len)
    out = seq[len(prompt) :][:new_tokens]
    return out, lens


@torch.no_grad()
def greedy(target, prompt, new_tokens, eos):
    cache = DynamicCache()
    lg = forward(target, prompt, cache)
    out = [int(lg[-1].argmax())]
    while len(out) < new_tokens and out[-1] not in eos:
        lg = forward(target, [out[-1]], cache)
        out.append(int(lg[-1].argmax()))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("out/acceptance"))
    ap.add_argument("--gamma", default="4")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--prompts", default="*.json")
    ap.add_argument(
        "--cache",
        type=Path,
        default=Path(os.environ.get("DUSTIN_CACHE", Path.home() / ".cache" / "dustin")),
    )
    ap.add_argument("--no-greedy-check", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    target = load(args.cache / "models" / TARGET)
    draft = load(args.cache / "models" / DRAFT)
    eos = {target.config.eos_token_id} if isinstance(target.config.eos_token_id, int) else set(
        target.config.eos_token_id or []
    )
    results = args.out / "hf_acceptance.jsonl"
    for p in sorted((args.out / "prompts").glob(args.prompts)):
        prompt = json.loads(p.read_text())
        ref = None if args.no_greedy_check else greedy(target, prompt, args.new_tokens, eos)
        for g in [int(x) for x in args.gamma.split(",")]:
            t = time.time()
            out, lens = speculative(target, draft, prompt, g, args.new_tokens, eos)
            row = {
                "prompt": p.name,
                "ctx": len(prompt),
                "gamma": g,
                "new_tokens": len(out),
                "iterations": len(lens),
                "mean_acceptance_length": sum(lens) / max(1, len(lens)),
                "same_as_greedy": None if ref is None else out == ref[: len(out)],
                "secs": time.time() - t,
                "output": out,
            }
            print(json.dumps({k: v for k, v in row.items() if k != "output"}), flush=True)
            with results.open("a") as f:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
