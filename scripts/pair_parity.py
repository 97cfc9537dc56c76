#!/usr/bin/env python3
"""Reference logits and greedy continuations of the Qwen2.5-Coder pair for the parity test
(crates/dustin-qwen/tests/pair_parity.rs): HF transformers loading the same Q4_K_M GGUF files
(it dequantises every tensor to float with the `gguf` package), eager attention, float32.

Prompt: the first PROMPT_TOKENS tokens of CPython 3.11's `Lib/textwrap.py`
(`../shared/data/code/textwrap.py`, PSF license), tokenised by transformers' GGUF tokenizer
without special tokens; the text tokenised is stored so the Rust test can check our tokenizer
gives the same ids.

For each model, writes crates/dustin-qwen/tests/fixtures/pair_parity/<model>.json:
- `prompt_ids`; at every prompt position the top-8 (ids, logits) of the row;
- `greedy`: GREEDY_TOKENS tokens of greedy decoding with the KV cache, and at each step the
  top-2 gap of the row it was chosen from (a near-tie may flip under other rounding);
- `f32_vs_f64_max_abs` (0.5B only): how far transformers' float32 logits are from its own
  float64 run of the same prompt, the scale of rounding error to expect.
and prompt.txt (the text).

Needs `pip install -r scripts/requirements.txt` (torch, transformers, gguf, accelerate,
numpy). Memory: about 7 GB for the 1.5B in float32.

Usage: python3 scripts/pair_parity.py [--models 0.5b,1.5b] [--cache DIR]
"""

import argparse
import json
import os
import platform
from pathlib import Path

import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "crates" / "dustin-qwen" / "tests" / "fixtures" / "pair_parity"
CODE = ROOT.parent / "shared" / "data" / "code" / "textwrap.py"
FILES = {
    "0.5b": "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    "1.5b": "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
}
PROMPT_TOKENS = 160
GREEDY_TOKENS = 64
TOP_K = 8


def top(row: np.ndarray):
    order = np.argsort(-row, kind="stable")[:TOP_K]
    return [int(i) for i in order], [float(row[i]) for i in order]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="0.5b,1.5b")
    ap.add_argument(
        "--cache",
        type=Path,
        default=Path(os.environ.get("DUSTIN_CACHE", Path.home() / ".cache" / "dustin")),
    )
    args = ap.parse_args()
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    OUT.mkdir(parents=True, exist_ok=True)
    text_all = CODE.read_text(encoding="utf-8")
    for name in args.models.split(","):
        path = args.cache / "models" / FILES[name]
        tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        ids_all = tok(text_all[:4000], add_special_tokens=False)["input_ids"]
        ids = ids_all[:PROMPT_TOKENS]
        text = tok.decode(ids)
        assert tok(text, add_special_tokens=False)["input_ids"] == ids
        (OUT / "prompt.txt").write_text(text, encoding="utf-8")
        model = AutoModelForCausalLM.from_pretrained(
            path.parent, gguf_file=path.name, dtype=torch.float32, attn_implementation="eager"
        ).eval()
        x = torch.tensor([ids], dtype=torch.long)
        with torch.no_grad():
            out = model(x, use_cache=True)
            logits = out.logits[0].double().numpy()
            past = out.past_key_values
            greedy, gaps = [], []
            row = logits[-1]
            for _ in range(GREEDY_TOKENS):
                t, v = top(row)
                greedy.append(t[0])
                gaps.append(v[0] - v[1])
                o = model(torch.tensor([[t[0]]]), past_key_values=past, use_cache=True)
                past = o.past_key_values
                row = o.logits[0, -1].double().numpy()
        ref = {
            "model": path.name,
            "dtype": "float32 (transformers dequantises the GGUF to float32), eager attention",
            "versions": {
                "python": platform.python_version(),
                "torch": torch.__version__,
                "transformers": transformers.__version__,
            },
            "prompt_source": f"textwrap.py (CPython 3.11), first {PROMPT_TOKENS} ids",
            "vocab": int(logits.shape[1]),
            "prompt_ids": [int(i) for i in ids],
            "top_ids": [top(r)[0] for r in logits],
            "top_logits": [top(r)[1] for r in logits],
            "greedy": greedy,
            "greedy_top2_gap": gaps,
        }
        if name == "0.5b":
            m64 = model.to(torch.float64)
            with torch.no_grad():
                l64 = m64(x).logits[0].numpy()
            ref["f32_vs_f64_max_abs"] = float(np.abs(l64 - logits).max())
            del m64
        (OUT / f"{name}.json").write_text(json.dumps(ref, separators=(",", ":")) + "\n")
        print(
            f"{name}: {len(ids)} prompt ids, greedy {tok.decode(greedy)!r}, "
            f"min greedy gap {min(gaps):.3e}, f32 vs f64 {ref.get('f32_vs_f64_max_abs')}"
        )
        del model


if __name__ == "__main__":
    main()
