#!/usr/bin/env python3
"""Expected token ids for the GGUF tokenizer tests:
crates/dustin-qwen/tests/fixtures/gguf/tokenizer_ids.json.

Needs `pip install gguf numpy tokenizers`. Optional cross-checks, used when installed:
`llama-cpp-python` (llama.cpp's own tokenizer on the same GGUF, `vocab_only`) and
`transformers` (its GGUF tokenizer conversion; it imports torch only for tensor dtypes, so
without torch a stub module stands in, as nothing here touches tensors).

The reference ids are produced by the Python `tokenizers` package from the GGUF metadata,
assembled as each model's own Hugging Face `tokenizer.json` is:
- SmolLM2 (`tokenizer.ggml.pre = smollm`): BPE without unk, pre-tokenizer
  Sequence[Digits(individual_digits=True), ByteLevel(add_prefix_space=False, use_regex=True)],
  no normalizer, control tokens as special added tokens, no BOS;
- the Qwen2 vocabulary file (`pre = deepseek-r1-qwen`): pre-tokenizer
  Sequence[Split(Qwen2 regex, isolated), ByteLevel(add_prefix_space=False, use_regex=False)],
  control tokens special, user-defined tokens (`<think>`) plain added tokens, BOS prepended
  (`add_bos_token = true`).
Then each reference that is installed is compared with it and the outcome recorded in the
JSON (`cross_checks`); a disagreement is printed, not hidden.

Usage: python3 scripts/gguf_tokenizer_ids.py [--smollm2 PATH] [--qwen2-vocab PATH]
"""

import argparse
import importlib.machinery
import json
import os
import sys
import types
from pathlib import Path

import gguf
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "crates" / "dustin-qwen" / "tests" / "fixtures" / "gguf" / "tokenizer_ids.json"
SHARED = ROOT.parent / "shared" / "data"

QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

CASES = [
    "Hello world",
    "In 2024, 12345 apples cost $3.50 (about 1,000,000 of them).",
    "I'm sure they'll say it's fine, don't you think? WE'VE SEEN IT'S DONE.",
    "  leading spaces,\ttabs\tand\n\nnew lines \r\n trailing   ",
    "Café naïve résumé façade Ångström — “quotes” … ¿qué?",
    "你好，世界！这是一个测试。日本語のテキスト 한국어 Россия",
    "emoji 🎉🚀 and symbols ∑∫√ ≤≥ ©®™ \u00a0nbsp",
    "fn main() {\n    println!(\"{}\", x[0] + 42);\n}\n",
    "<|im_start|>user\nWhat is 7*8?<|im_end|>\n<|im_start|>assistant\n",
    "<think>\nStep 1: 3+4=7.\n</think>\n<｜User｜>hi<｜Assistant｜>",
    "    ",
    "a",
    "",
]


def default_smollm2() -> Path:
    cache = Path(os.environ.get("DUSTIN_CACHE", Path.home() / ".cache" / "dustin"))
    return cache / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"


def book_2544() -> str:
    """PG-19 book 2544 between the Gutenberg START and END lines, CRLF kept (as the Rust
    tests take it)."""
    text = (SHARED / "pg19" / "2544.txt").read_bytes().decode("utf-8")
    start = text.index("*** START OF")
    start = text.index("\n", start) + 1
    return text[start : text.index("*** END OF")]


def book_paragraph() -> str:
    return book_2544()[2000:3500]


def fnv1a64(ids: list[int]) -> str:
    """FNV-1a (64-bit) over the ids as little-endian u32 bytes, as hex."""
    h = 0xCBF29CE484222325
    for i in ids:
        for b in int(i).to_bytes(4, "little"):
            h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def read_vocab(path: Path) -> dict:
    r = gguf.GGUFReader(path)

    def field(name):
        f = r.fields.get(name)
        return None if f is None else f.contents()

    return {
        "model": field("tokenizer.ggml.model"),
        "pre": field("tokenizer.ggml.pre"),
        "tokens": field("tokenizer.ggml.tokens"),
        "types": field("tokenizer.ggml.token_type"),
        "merges": field("tokenizer.ggml.merges"),
        "bos": field("tokenizer.ggml.bos_token_id"),
        "add_bos": field("tokenizer.ggml.add_bos_token"),
    }


def build(v: dict) -> Tokenizer:
    vocab = {t: i for i, t in enumerate(v["tokens"])}
    merges = [tuple(m.split(" ", 1)) for m in v["merges"]]
    tk = Tokenizer(models.BPE(vocab, merges, unk_token=None, fuse_unk=False, byte_fallback=False))
    if v["pre"] == "smollm":
        tk.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
            ]
        )
    elif v["pre"] in ("qwen2", "deepseek-r1-qwen"):
        tk.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
            ]
        )
    else:
        raise SystemExit(f"no reference assembly for pre={v['pre']!r}")
    tk.decoder = decoders.ByteLevel()
    types_ = v["types"] or []
    tk.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t, ty in zip(v["tokens"], types_) if ty == 3]
    )
    tk.add_tokens([AddedToken(t, special=False, normalized=False) for t, ty in zip(v["tokens"], types_) if ty == 4])
    if v["add_bos"]:
        bos = v["tokens"][v["bos"]]
        tk.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos}:1 $B:1", special_tokens=[(bos, v["bos"])]
        )
    return tk


def llama_cpp_ids(path: Path, texts: list[str]):
    try:
        import llama_cpp
    except ImportError:
        return None
    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    return [llm.tokenize(t.encode("utf-8"), add_bos=False, special=True) for t in texts]


class _TorchStub(types.ModuleType):
    """Stands in for torch: transformers' GGUF reader names torch types at import time but
    the tokenizer path never uses them."""

    def __init__(self, name):
        super().__init__(name)
        self.__spec__ = importlib.machinery.ModuleSpec(name, None)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return type(name, (), {})


def transformers_ids(path: Path, texts: list[str]):
    try:
        import torch  # noqa: F401
    except ImportError:
        sys.modules["torch"] = _TorchStub("torch")
    try:
        # What AutoTokenizer.from_pretrained(..., gguf_file=) runs for the tokenizer, called
        # directly (the AutoTokenizer entry point insists on a real torch).
        from transformers.integrations.gguf.gguf_tokenizer_mapping import (
            convert_gguf_tokenizer,
            get_gguf_tokenizer,
        )

        arch, tok_dict, _ = get_gguf_tokenizer(str(path))
        tk, _ = convert_gguf_tokenizer(arch, tok_dict)
    except Exception as e:  # noqa: BLE001 - report and go on without this reference
        print(f"  transformers unavailable: {type(e).__name__}: {str(e)[:200]}")
        return None
    return [tk.encode(t, add_special_tokens=False).ids for t in texts]


def compare(label: str, ref: list[list[int]], other, texts: list[str]) -> dict:
    if other is None:
        return {"reference": label, "status": "not installed"}
    bad = [i for i, (a, b) in enumerate(zip(ref, other)) if a != b]
    for i in bad:
        print(f"  {label} differs on case {i} {texts[i][:40]!r}:\n    ours {ref[i][:24]}\n    them {other[i][:24]}")
    return {
        "reference": label,
        "status": "agrees on all cases" if not bad else "differs",
        "differing_cases": bad,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--smollm2", type=Path, default=default_smollm2())
    ap.add_argument("--qwen2-vocab", type=Path, default=SHARED / "tokenizers" / "qwen2-bpe-vocab.gguf")
    args = ap.parse_args()
    texts = CASES + [book_paragraph()]
    out = {}
    for key, path in [("smollm2", args.smollm2), ("qwen2_vocab", args.qwen2_vocab)]:
        if not path.exists():
            print(f"{key}: {path} absent, skipped")
            continue
        print(f"{key}: {path}")
        v = read_vocab(path)
        tk = build(v)
        ids = [tk.encode(t, add_special_tokens=False).ids for t in texts]
        for t, i in zip(texts, ids):
            assert tk.decode(i, skip_special_tokens=False) == t, (t, i)
        with_special = tk.encode(texts[0], add_special_tokens=True).ids
        book = book_2544()
        book_ids = tk.encode(book, add_special_tokens=False).ids
        all_texts = texts + [book]
        all_ids = ids + [book_ids]
        checks = [
            compare("llama.cpp (llama-cpp-python, vocab_only)", all_ids, llama_cpp_ids(path, all_texts), all_texts),
            compare(
                "transformers GGUF tokenizer conversion (get_gguf_tokenizer + convert_gguf_tokenizer)",
                all_ids,
                transformers_ids(path, all_texts),
                all_texts,
            ),
        ]
        out[key] = {
            "file": path.name,
            "pre": v["pre"],
            "source": "python tokenizers, assembled as the model's HF tokenizer.json (see script)",
            "cross_checks": checks,
            "with_special_tokens": {"text": texts[0], "ids": with_special},
            "cases": [{"text": t, "ids": i} for t, i in zip(texts, ids)],
            # The whole book (the last case of the cross-checks), too long to store: its id
            # count and a checksum.
            "book_2544": {"n_ids": len(book_ids), "fnv1a64": fnv1a64(book_ids)},
        }
    OUT.write_text(json.dumps(out, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
