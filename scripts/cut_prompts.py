#!/usr/bin/env python3
"""Cut long texts into prompt files of a given token count, for batched runs of `dustin
generate` (one `--prompt-file` per sequence) on real text.

Each source is tokenized with the model's own vocabulary and merges, read from its GGUF file
(the `gguf` package) into a `tokenizers` byte-level BPE with Qwen2's pre-tokenizer pattern and
NFC normalisation (as HF transformers' Qwen2 tokenizer); windows of `--tokens` tokens start at 0, `--stride`, 2 * `--stride`, ... while they
fit; the prompts take one window of each source in turn, so that any first B of them mix the
sources. A window is written as the text its tokens decode to; re-encoded, that text may
differ by a few tokens, and the JSON lines printed say by how much. PG-19 books lose their
Project Gutenberg header and footer first.

Usage:
  python3 scripts/cut_prompts.py --model DIR/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf \
      --tokens 32000 --count 16 --stride 8000 --out OUT SOURCE...
"""

import argparse
import json
import re
from pathlib import Path

from gguf import GGUFReader
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

# Qwen2's pre-tokenizer pattern (the `pretokenize_regex` of HF transformers' Qwen2Tokenizer)
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def strings(reader: GGUFReader, key: str) -> list:
    f = reader.fields[key]
    return [bytes(f.parts[i]).decode("utf-8") for i in f.data]


def gguf_tokenizer(path: Path) -> Tokenizer:
    r = GGUFReader(path)
    vocab = {t: i for i, t in enumerate(strings(r, "tokenizer.ggml.tokens"))}
    merges = [tuple(m.split(" ", 1)) for m in strings(r, "tokenizer.ggml.merges")]
    tok = Tokenizer(models.BPE(vocab, merges, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    return tok


def strip_gutenberg(text: str) -> str:
    start = re.search(r"\*\*\* ?START OF[^\n]*\n", text)
    end = re.search(r"\*\*\* ?END OF", text)
    if start and end and start.end() < end.start():
        return text[start.end() : end.start()]
    return text


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", type=Path, required=True, help="the target's GGUF file")
    ap.add_argument("--tokens", type=int, required=True)
    ap.add_argument("--count", type=int, required=True)
    ap.add_argument("--stride", type=int, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("sources", type=Path, nargs="+")
    args = ap.parse_args()
    tok = gguf_tokenizer(args.model)
    windows = []
    for src in args.sources:
        ids = tok.encode(strip_gutenberg(src.read_text())).ids
        offs = list(range(0, len(ids) - args.tokens + 1, args.stride))
        if not offs:
            raise SystemExit(f"{src}: {len(ids)} tokens, fewer than --tokens {args.tokens}")
        windows.append([(src.name, o, ids[o : o + args.tokens]) for o in offs])
    picked = []
    while len(picked) < args.count and any(windows):
        for w in windows:
            if w and len(picked) < args.count:
                picked.append(w.pop(0))
    if len(picked) < args.count:
        raise SystemExit(f"only {len(picked)} windows fit, --count {args.count}")
    args.out.mkdir(parents=True, exist_ok=True)
    for i, (name, off, ids) in enumerate(picked):
        text = tok.decode(ids)
        path = args.out / f"{i:02d}.txt"
        path.write_text(text)
        again = len(tok.encode(text).ids)
        print(json.dumps({"file": path.name, "source": name, "offset": off, "tokens": again}))


if __name__ == "__main__":
    main()
