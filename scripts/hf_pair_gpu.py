#!/usr/bin/env python3
"""HF transformers peers of the Qwen2.5-Coder pair on a GPU: `generate` (autoregressive) and
assisted generation (the 0.5B drafting for the 1.5B), greedy, batch 1, bf16, on the prompts
`dustin eval acceptance` wrote (`<out>/prompts/<source>.ctx<N>.json`, token ids), so that both
engines decode the same tokens after the same context.

Prints one JSON line per (prompt, mode): tokens/s of the decoding after the prompt's prefill
(the time of `generate` with `max_new_tokens` minus that of a 1-token `generate` on the same
prompt, which holds the prefill), new tokens, and whether the tokens equal the autoregressive
ones.

Usage:
  python3 scripts/hf_pair_gpu.py --out OUT [--models DIR] [--new-tokens 128] [--gamma 4]
      [--prompts PATTERN]

Needs torch with CUDA, transformers and the `gguf` package (transformers dequantises the GGUF
files to bf16 here).
"""

import argparse
import json
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

TARGET = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
DRAFT = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"


def load(path: Path):
    return (
        AutoModelForCausalLM.from_pretrained(
            path.parent, gguf_file=path.name, dtype=torch.bfloat16, attn_implementation="sdpa"
        )
        .cuda()
        .eval()
    )


def timed(fn):
    torch.cuda.synchronize()
    t = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return out, time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--models", type=Path, default=Path.home() / ".cache/dustin/models")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--prompts", default="*.json")
    args = ap.parse_args()
    target = load(args.models / TARGET)
    draft = load(args.models / DRAFT)
    dev = torch.device("cuda")
    for p in sorted((args.out / "prompts").glob(args.prompts)):
        ids = torch.tensor([json.loads(p.read_text())], device=dev)
        common = dict(do_sample=False, min_new_tokens=args.new_tokens, pad_token_id=0)
        with torch.inference_mode():
            # warm-up (kernels, allocator), then the prefill alone
            target.generate(ids, max_new_tokens=4, **{**common, "min_new_tokens": 4})
            _, t_pre = timed(lambda: target.generate(ids, max_new_tokens=1, **{**common, "min_new_tokens": 1}))
            ar, t_ar = timed(lambda: target.generate(ids, max_new_tokens=args.new_tokens, **common))
            draft.generation_config.num_assistant_tokens = args.gamma
            draft.generation_config.num_assistant_tokens_schedule = "constant"
            draft.generation_config.assistant_confidence_threshold = 0.0
            target.generate(ids, max_new_tokens=8, assistant_model=draft, **{**common, "min_new_tokens": 8})
            sd, t_sd = timed(
                lambda: target.generate(
                    ids, max_new_tokens=args.new_tokens, assistant_model=draft, **common
                )
            )
        n = ids.shape[1]
        ar_new, sd_new = ar[0, n:].tolist(), sd[0, n:].tolist()
        for mode, toks, secs in (("hf_generate", ar_new, t_ar), ("hf_assisted", sd_new, t_sd)):
            row = {
                "prompt": p.stem,
                "ctx": n,
                "mode": mode,
                "new_tokens": len(toks),
                "prefill_s": round(t_pre, 4),
                "total_s": round(secs, 4),
                "tokens_per_s": round((len(toks) - 1) / max(secs - t_pre, 1e-9), 2),
                "same_as_generate": toks == ar_new,
                "gamma": args.gamma if mode == "hf_assisted" else None,
            }
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
