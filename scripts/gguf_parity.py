#!/usr/bin/env python3
"""Reference logits for the GGUF parity test (crates/dustin-qwen/tests/gguf_parity.rs):
HF transformers loading SmolLM2-135M-Instruct.Q4_1.gguf itself (it dequantises every tensor to
float with the `gguf` package), run in float64 with eager attention on a 256-token prompt.

Needs `pip install torch transformers gguf accelerate numpy` (transformers refuses GGUF without
accelerate).

Prompt: PG-19 book 2544 (/work/shared/data/pg19/2544.txt), CRLF normalised to LF, everything up to
and including the "*** START OF" line dropped, starting at "There was a slight jarring"; the
first PREFIX_CHARS characters of that are tokenised by transformers' GGUF tokenizer (no special
tokens) and the first 256 ids kept. The text tokenised is stored (prompt.txt) so the Rust test can
check that our tokenizer gives the same 256 ids.

Writes crates/dustin-qwen/tests/fixtures/gguf_parity/:
- reference.json: versions, prompt ids, which positions have full rows, and for every position
  the argmax id, the max logit, and the top-8 (ids, logits) of that row;
- prompt.txt: the text tokenised;
- logits_pos{P}.bin: the full row (vocab floats, float32 little-endian) at position P, for
  P in FULL_ROWS (the first, the middle and the last position).

Usage: python3 scripts/gguf_parity.py [--gguf PATH]
"""

import argparse
import json
import os
import platform
import sys
from pathlib import Path

import gguf
import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "crates" / "dustin-qwen" / "tests" / "fixtures" / "gguf_parity"
BOOK = ROOT.parent / "shared" / "data" / "pg19" / "2544.txt"
DEFAULT_GGUF = Path(os.environ.get("DUSTIN_CACHE", Path.home() / ".cache" / "dustin")) / (
    "models/SmolLM2-135M-Instruct.Q4_1.gguf"
)
N_TOKENS = 256
PREFIX_CHARS = 2000  # comfortably more than 256 tokens of prose
FULL_ROWS = [0, 127, 255]
TOP_K = 8


def prompt_text() -> str:
    text = BOOK.read_text(encoding="utf-8").replace("\r\n", "\n")
    start = text.index("*** START OF")
    body = text[text.index("\n", start) + 1 :]
    at = body.index("There was a slight jarring")
    return body[at : at + PREFIX_CHARS]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", type=Path, default=DEFAULT_GGUF)
    args = ap.parse_args()
    path: Path = args.gguf
    if not path.exists():
        sys.exit(f"{path} absent")

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    text = prompt_text()
    all_ids = tok(text, add_special_tokens=False)["input_ids"]
    assert len(all_ids) > N_TOKENS + 16, len(all_ids)
    ids = all_ids[:N_TOKENS]

    model = AutoModelForCausalLM.from_pretrained(
        path.parent,
        gguf_file=path.name,
        dtype=torch.float32,
        attn_implementation="eager",
    )
    model = model.eval()
    x = torch.tensor([ids], dtype=torch.long)
    # float32 run first: how far f32 transformers is from its own f64 (the scale of error to
    # expect from f32 accumulation order alone)
    with torch.no_grad():
        l32 = model(x).logits[0].double().numpy()
    # `.double()` goes through nn.Module (transformers' own `.float()`/`.half()` refuse GGUF
    # models, flagged quantized, though their weights are already dequantised floats)
    model = model.to(torch.float64)
    assert all(p.dtype == torch.float64 for p in model.parameters())
    with torch.no_grad():
        logits = model(x).logits[0]  # [256, vocab], f64
    assert logits.dtype == torch.float64, logits.dtype
    logits = logits.numpy()
    n, vocab = logits.shape
    assert n == N_TOKENS
    f32_vs_f64 = float(np.abs(l32 - logits).max())
    f32_argmax_agree = int((l32.argmax(-1) == logits.argmax(-1)).sum())

    order = np.argsort(-logits, axis=-1, kind="stable")[:, :TOP_K]
    top_vals = np.take_along_axis(logits, order, axis=-1)
    argmax = logits.argmax(-1)
    assert (argmax == order[:, 0]).all()

    OUT.mkdir(parents=True, exist_ok=True)
    for old in OUT.glob("logits_pos*.bin"):
        old.unlink()
    for p in FULL_ROWS:
        logits[p].astype("<f4").tofile(OUT / f"logits_pos{p}.bin")
    (OUT / "prompt.txt").write_text(text, encoding="utf-8")

    ref = {
        "model": path.name,
        "dtype": "float64 (transformers dequantises the GGUF to float32, then model.double())",
        "attn_implementation": "eager",
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "gguf": getattr(gguf, "__version__", None) or _dist_version("gguf"),
            "numpy": np.__version__,
        },
        "prompt_source": "pg19/2544.txt, CRLF->LF, from 'There was a slight jarring', "
        f"first {PREFIX_CHARS} chars tokenised (no special tokens), first {N_TOKENS} ids",
        "vocab": vocab,
        "prompt_ids": [int(i) for i in ids],
        "full_rows": FULL_ROWS,
        "argmax": [int(i) for i in argmax],
        "max_logit": [float(v) for v in top_vals[:, 0]],
        "top_ids": [[int(i) for i in r] for r in order],
        "top_logits": [[float(v) for v in r] for r in top_vals],
        "top2_gap": [float(r[0] - r[1]) for r in top_vals],
        "transformers_f32_vs_f64_max_abs": f32_vs_f64,
        "transformers_f32_argmax_agree": f32_argmax_agree,
    }
    (OUT / "reference.json").write_text(json.dumps(ref, indent=None, separators=(",", ":")) + "\n")

    size = sum(f.stat().st_size for f in OUT.iterdir())
    print(f"versions: {ref['versions']}")
    print(f"prompt: {len(text)} chars -> {len(all_ids)} ids, kept {N_TOKENS}; first 16: {ids[:16]}")
    print(f"decoded prompt head: {tok.decode(ids[:24])!r}")
    print(f"logits: {n} x {vocab}, |max| {np.abs(logits).max():.3f}, "
          f"max logit range [{top_vals[:, 0].min():.3f}, {top_vals[:, 0].max():.3f}]")
    print(f"min top-2 gap {min(ref['top2_gap']):.3e} at position {int(np.argmin(ref['top2_gap']))}")
    print(f"transformers f32 vs f64: max abs {f32_vs_f64:.3e}, argmax agree {f32_argmax_agree}/{n}")
    print(f"wrote {OUT} ({size} bytes)")


def _dist_version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


if __name__ == "__main__":
    main()
