#!/usr/bin/env python3
"""Writes the dequantisation fixtures of crates/dustin-qwen/tests/fixtures/dequant/.

Run from anywhere (needs `gguf` and `numpy`, see scripts/requirements.txt; gguf 0.19.0 and
numpy 2.4 were used):

    /work/scratch/venv/bin/python scripts/gguf_dequant_fixtures.py [--models DIR]

For each ggml type Q5_0, Q5_1, Q2_K, Q3_K, Q5_K, IQ4_NL, IQ4_XS it writes `<TYPE>.bin`
holding test cases; the expected values of each case are `gguf.quants.dequantize(bytes,
type)` as float32, stored as their bit patterns, so the Rust test
(crates/dustin-qwen/tests/gguf_dequant_fixtures.rs) can compare bit for bit. The cases:

- `random`: 2048 elements' worth of random bytes (64 blocks of 32-element types, 8 of the
  256-element k-quant / IQ4_XS super-blocks; fixed seed), with every f16 field of each block
  (`d`, and `m` / `dmin` where the block has one) overwritten by a finite f16 of moderate
  magnitude (|x| log-uniform in [2^-12, 2^2], random sign), so there is no inf / NaN;
- `edge`: 4 blocks of random bytes whose f16 fields are +0.0, -0.0, an f16 subnormal and
  the largest finite f16 (65504) in turn (finite; checks signed zeros and subnormal scales);
- `real`: blocks copied from real model files, for the types that occur in one: 2 blocks at
  a seeded position from each of up to 3 tensors of the type (first, middle and last in file
  order). The model files are Qwen2.5-Coder-0.5B/1.5B-Instruct Q4_K_M GGUFs
  (`<models>/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf`, `...-1.5b-...`; `--models` defaults to
  `$DUSTIN_CACHE/models` or `~/.cache/dustin/models`). Of the types above only Q5_0 occurs
  in them (0.5B: token_embd and most attention / FFN weights); Q5_1, Q2_K, Q3_K, Q5_K,
  IQ4_NL and IQ4_XS get random and edge blocks only. The script fails if a model file is
  missing (the fixtures would silently lose their real blocks).

File format of `<TYPE>.bin` (all little-endian):

    magic  b"DQFX"      4 bytes
    version u32 = 1
    ggml type id u32    (as in ggml.h: Q5_0 = 6, ..., IQ4_XS = 23)
    case count u32
    per case:
      kind u8           0 = random, 1 = edge, 2 = real
      label length u16, label UTF-8 (source of the blocks: "random seed ..." or
                        "<file>:<tensor>#block <i>")
      block count u32
      block bytes       block count * type size
      expected          block count * block size u32 (f32 bit patterns)

It also writes `manifest.json`: versions, seed, and per type the cases (kind, label, blocks).
Output is deterministic for a given gguf / numpy version and set of model files.
"""

import argparse
import json
import os
import struct
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "crates" / "dustin-qwen" / "tests" / "fixtures" / "dequant"
SEED = 20240521
RANDOM_ELEMENTS = 2048
REAL_TENSORS = 3
REAL_BLOCKS = 2
MODEL_FILES = [
    "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
]

# Byte offsets of the `ggml_half` fields of each block struct (ggml-common.h).
F16_FIELDS = {
    T.Q5_0: [0],  # block_q5_0 { half d; uint8 qh[4]; uint8 qs[16]; }
    T.Q5_1: [0, 2],  # block_q5_1 { half d; half m; uint8 qh[4]; uint8 qs[16]; }
    T.Q2_K: [80, 82],  # block_q2_K { uint8 scales[16]; uint8 qs[64]; half d; half dmin; }
    T.Q3_K: [108],  # block_q3_K { uint8 hmask[32]; uint8 qs[64]; uint8 scales[12]; half d; }
    T.Q5_K: [0, 2],  # block_q5_K { half d; half dmin; uint8 scales[12]; uint8 qh[32]; uint8 qs[128]; }
    T.IQ4_NL: [0],  # block_iq4_nl { half d; uint8 qs[16]; }
    T.IQ4_XS: [0],  # block_iq4_xs { half d; uint16 scales_h; uint8 scales_l[4]; uint8 qs[128]; }
}

KIND_RANDOM, KIND_EDGE, KIND_REAL = 0, 1, 2
KIND_NAMES = {KIND_RANDOM: "random", KIND_EDGE: "edge", KIND_REAL: "real"}


def default_models() -> Path:
    cache = Path(os.environ.get("DUSTIN_CACHE", Path.home() / ".cache" / "dustin"))
    return cache / "models"


def expected_bits(qtype: T, blocks: np.ndarray) -> np.ndarray:
    """`gguf.quants.dequantize` of the blocks (a flat uint8 array) as f32 bit patterns."""
    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    assert blocks.dtype == np.uint8 and blocks.ndim == 1 and blocks.size % type_size == 0
    values = dequantize(blocks.copy(), qtype)
    assert values.dtype == np.float32, values.dtype
    assert values.size == blocks.size // type_size * block_size
    return np.ascontiguousarray(values.reshape(-1)).view(np.uint32)


def set_f16(raw: np.ndarray, qtype: T, values: np.ndarray) -> None:
    """Overwrites every f16 field of each block (rows of `raw`) with `values[block, field]`."""
    for k, off in enumerate(F16_FIELDS[qtype]):
        halves = values[:, k].astype(np.float16)
        assert np.all(np.isfinite(halves))
        raw[:, off : off + 2] = halves.view(np.uint8).reshape(-1, 2)


def random_case(rng: np.random.Generator, qtype: T) -> tuple[int, str, np.ndarray]:
    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    n_blocks = RANDOM_ELEMENTS // block_size
    raw = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
    n_fields = len(F16_FIELDS[qtype])
    mag = np.exp2(rng.uniform(-12.0, 2.0, size=(n_blocks, n_fields)))
    sign = np.where(rng.integers(0, 2, size=(n_blocks, n_fields)) == 0, 1.0, -1.0)
    set_f16(raw, qtype, mag * sign)
    return KIND_RANDOM, f"random seed {SEED}", raw.reshape(-1)


def edge_case(rng: np.random.Generator, qtype: T) -> tuple[int, str, np.ndarray]:
    _, type_size = gguf.GGML_QUANT_SIZES[qtype]
    specials = np.array([0.0, -0.0, 2.0**-20, 65504.0])
    raw = rng.integers(0, 256, size=(len(specials), type_size), dtype=np.uint8)
    n_fields = len(F16_FIELDS[qtype])
    # every field of block i gets special i (fields of one block differ in sign)
    values = np.stack([specials * (1 if k % 2 == 0 else -1) for k in range(n_fields)], axis=1)
    set_f16(raw, qtype, values)
    return KIND_EDGE, f"random seed {SEED}, f16 fields +0, -0, 2^-20, 65504", raw.reshape(-1)


def real_cases(
    rng: np.random.Generator, qtype: T, readers: list[tuple[str, gguf.GGUFReader]]
) -> list[tuple[int, str, np.ndarray]]:
    _, type_size = gguf.GGML_QUANT_SIZES[qtype]
    found = [(fname, t) for fname, r in readers for t in r.tensors if t.tensor_type == qtype]
    if not found:
        return []
    picks = sorted({0, len(found) // 2, len(found) - 1})[:REAL_TENSORS]
    cases = []
    for i in picks:
        fname, t = found[i]
        data = np.asarray(t.data).reshape(-1).view(np.uint8)
        n_blocks = data.size // type_size
        at = int(rng.integers(0, n_blocks - REAL_BLOCKS + 1))
        blocks = np.array(data[at * type_size : (at + REAL_BLOCKS) * type_size], dtype=np.uint8)
        cases.append((KIND_REAL, f"{fname}:{t.name}#block {at}", blocks))
    return cases


def write_type(qtype: T, cases: list[tuple[int, str, np.ndarray]]) -> list[dict]:
    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    out = bytearray()
    out += b"DQFX"
    out += struct.pack("<III", 1, int(qtype), len(cases))
    listing = []
    for kind, label, blocks in cases:
        n_blocks = blocks.size // type_size
        bits = expected_bits(qtype, blocks)
        if kind != KIND_REAL:
            assert np.all(np.isfinite(bits.view(np.float32))), (qtype.name, label)
        lab = label.encode()
        out += struct.pack("<BH", kind, len(lab)) + lab
        out += struct.pack("<I", n_blocks)
        out += blocks.tobytes()
        out += bits.astype("<u4").tobytes()
        listing.append({"kind": KIND_NAMES[kind], "label": label, "blocks": n_blocks})
    (OUT / f"{qtype.name}.bin").write_bytes(bytes(out))
    return listing


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", type=Path, default=default_models(), help="folder of the model GGUFs")
    args = ap.parse_args()

    readers = []
    for name in MODEL_FILES:
        path = args.models / name
        if not path.exists():
            raise SystemExit(f"missing model file {path} (needed for the real blocks)")
        readers.append((name, gguf.GGUFReader(path)))

    OUT.mkdir(parents=True, exist_ok=True)
    manifest = {
        "generator": "scripts/gguf_dequant_fixtures.py",
        "reference": "gguf.quants.dequantize",
        "gguf": package_version("gguf"),
        "numpy": np.__version__,
        "seed": SEED,
        "models": MODEL_FILES,
        "types": {},
    }
    for qtype in F16_FIELDS:
        # one generator per type, so adding a type leaves the others' bytes unchanged
        rng = np.random.default_rng([SEED, int(qtype)])
        cases = [random_case(rng, qtype), edge_case(rng, qtype)]
        cases += real_cases(rng, qtype, readers)
        manifest["types"][qtype.name] = write_type(qtype, cases)
        n_real = sum(1 for c in cases if c[0] == KIND_REAL)
        print(f"{qtype.name}: {len(cases)} cases ({n_real} real)")
    (OUT / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    total = sum(p.stat().st_size for p in OUT.iterdir())
    print(f"wrote {OUT} ({total} bytes)")


def package_version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


if __name__ == "__main__":
    main()
