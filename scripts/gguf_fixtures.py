#!/usr/bin/env python3
"""Regenerates the GGUF test fixtures of crates/dustin-qwen/tests/fixtures/gguf/.

Needs `pip install gguf numpy` (gguf 0.19 was used). Deterministic (fixed seeds).

What it writes, all small:
- quants.gguf: one tensor per ggml type we dequantise (F32, F16, BF16, Q8_0, Q4_0, Q4_1,
  Q4_K, Q6_K), plus `real_q4_1` / `real_q8_0`: raw blocks copied from the SmolLM2-135M-Instruct
  Q4_1 GGUF (rows of blk.0.attn_q.weight and token_embd.weight) when that file is in the model
  cache. Q8_0 / Q4_0 / Q4_1 / BF16 are quantised from random data with
  `gguf.quants.quantize`; the package cannot quantise Q4_K / Q6_K, so those are random valid
  blocks (random bytes with finite f16 scales).
- quants/<name>.f32: `gguf.quants.dequantize` of each tensor (raw little-endian f32), the
  values our dequantiser must reproduce exactly.
- tiny_llama.gguf, tiny_qwen2.gguf: two-layer models with F32 weights written the way
  llama.cpp's convert_hf_to_gguf.py writes them (Llama q/k rows permuted by
  `LlamaModel.permute`; Qwen2 with q/k/v biases and tied embeddings);
  tiny_llama/<hf name>.f32, tiny_qwen2/<hf name>.f32: the HF-layout tensors they came from;
  tiny_*.json: HF name -> shape.

Usage: python3 scripts/gguf_fixtures.py [--smollm2 PATH]
"""

import argparse
import json
import os
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize, quantize

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "crates" / "dustin-qwen" / "tests" / "fixtures" / "gguf"


def default_smollm2() -> Path:
    cache = Path(os.environ.get("DUSTIN_CACHE", Path.home() / ".cache" / "dustin"))
    return cache / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"


def write_f32(path: Path, a: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(np.ascontiguousarray(a, dtype="<f4").tobytes())


def random_k_blocks(rng: np.random.Generator, qtype: T, n_blocks: int) -> np.ndarray:
    """Random but valid Q4_K / Q6_K blocks: random bytes, finite f16 scales."""
    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
    if qtype == T.Q4_K:
        # block_q4_K { half d; half dmin; uint8 scales[12]; uint8 qs[128]; }
        d = rng.uniform(0.001, 0.05, n_blocks).astype(np.float16)
        dmin = rng.uniform(0.001, 0.05, n_blocks).astype(np.float16)
        raw[:, 0:2] = d.view(np.uint8).reshape(n_blocks, 2)
        raw[:, 2:4] = dmin.view(np.uint8).reshape(n_blocks, 2)
    elif qtype == T.Q6_K:
        # block_q6_K { uint8 ql[128]; uint8 qh[64]; int8 scales[16]; half d; }
        d = rng.uniform(-0.01, 0.01, n_blocks).astype(np.float16)
        raw[:, 208:210] = d.view(np.uint8).reshape(n_blocks, 2)
    else:
        raise ValueError(qtype)
    return raw


def real_rows(path: Path, name: str, rows: list[int]) -> tuple[np.ndarray, T, int]:
    """Raw bytes of some rows of a tensor of a real GGUF file."""
    reader = gguf.GGUFReader(path)
    t = next(t for t in reader.tensors if t.name == name)
    data = np.asarray(t.data)  # (rows, bytes per row) for quantised tensors
    return np.stack([data[r] for r in rows]), T(t.tensor_type), int(t.shape[0])


def quants(smollm2: Path) -> None:
    rng = np.random.default_rng(2544)
    w = gguf.GGUFWriter(OUT / "quants.gguf", arch="dustin-test")
    w.add_string("dustin.fixture", "dequantisation reference of gguf.quants 0.19")
    entries = []  # (name, qtype, raw uint8 blocks, (rows, cols))
    x = rng.standard_normal((2, 64)).astype(np.float32)
    w.add_tensor("f32", x)
    entries.append(("f32", T.F32, x))
    w.add_tensor("f16", x.astype(np.float16))
    entries.append(("f16", T.F16, x.astype(np.float16)))
    for name, qtype, shape in [
        ("bf16", T.BF16, (2, 64)),
        ("q8_0", T.Q8_0, (4, 64)),
        ("q4_0", T.Q4_0, (4, 64)),
        ("q4_1", T.Q4_1, (4, 64)),
    ]:
        data = (rng.standard_normal(shape) * 0.1).astype(np.float32)
        data[0, :8] = [0.0, 1.0, -1.0, 1e-8, 65504.0, -3.5, 0.25, 2.0]  # a few edge values
        q = quantize(data, qtype)
        w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=qtype)
        entries.append((name, qtype, q))
    for name, qtype in [("q4_k", T.Q4_K), ("q6_k", T.Q6_K)]:
        blocks = random_k_blocks(rng, qtype, 4).reshape(2, -1)  # 2 rows of 512
        w.add_tensor(name, blocks, raw_shape=blocks.shape, raw_dtype=qtype)
        entries.append((name, qtype, blocks))
    if smollm2.exists():
        for name, src, rows in [
            ("real_q4_1", "blk.0.attn_q.weight", [0, 1, 300]),
            ("real_q8_0", "token_embd.weight", [0, 1, 1000, 49151]),
        ]:
            raw, qtype, _ = real_rows(smollm2, src, rows)
            w.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=qtype)
            entries.append((name, qtype, raw))
    else:
        print(f"note: {smollm2} absent; real blocks left out")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    for name, qtype, data in entries:
        if qtype in (T.F32, T.F16):
            ref = data.astype(np.float32)
        else:
            ref = dequantize(data, qtype)
        write_f32(OUT / "quants" / f"{name}.f32", ref)
        print(f"quants.gguf: {name} {qtype.name} -> {ref.shape}")


def permute(w: np.ndarray, n_head: int, n_head_kv: int | None) -> np.ndarray:
    """convert_hf_to_gguf.py LlamaModel.permute."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def tiny_model(arch: str) -> None:
    rng = np.random.default_rng(7 if arch == "llama" else 8)
    layers, hidden, heads, kv, ffn, vocab, ctx = 2, 16, 4, 2, 32, 24, 128
    hd = hidden // heads
    hf: dict[str, np.ndarray] = {}

    def r(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    hf["model.embed_tokens.weight"] = r(vocab, hidden)
    hf["model.norm.weight"] = r(hidden)
    if arch == "llama":
        hf["lm_head.weight"] = r(vocab, hidden)
    for i in range(layers):
        p = f"model.layers.{i}."
        hf[p + "self_attn.q_proj.weight"] = r(heads * hd, hidden)
        hf[p + "self_attn.k_proj.weight"] = r(kv * hd, hidden)
        hf[p + "self_attn.v_proj.weight"] = r(kv * hd, hidden)
        if arch == "qwen2":
            hf[p + "self_attn.q_proj.bias"] = r(heads * hd)
            hf[p + "self_attn.k_proj.bias"] = r(kv * hd)
            hf[p + "self_attn.v_proj.bias"] = r(kv * hd)
        hf[p + "self_attn.o_proj.weight"] = r(hidden, heads * hd)
        hf[p + "mlp.gate_proj.weight"] = r(ffn, hidden)
        hf[p + "mlp.up_proj.weight"] = r(ffn, hidden)
        hf[p + "mlp.down_proj.weight"] = r(hidden, ffn)
        hf[p + "input_layernorm.weight"] = r(hidden)
        hf[p + "post_attention_layernorm.weight"] = r(hidden)

    names = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    per_layer = {
        "self_attn.q_proj.weight": "attn_q.weight",
        "self_attn.k_proj.weight": "attn_k.weight",
        "self_attn.v_proj.weight": "attn_v.weight",
        "self_attn.q_proj.bias": "attn_q.bias",
        "self_attn.k_proj.bias": "attn_k.bias",
        "self_attn.v_proj.bias": "attn_v.bias",
        "self_attn.o_proj.weight": "attn_output.weight",
        "mlp.gate_proj.weight": "ffn_gate.weight",
        "mlp.up_proj.weight": "ffn_up.weight",
        "mlp.down_proj.weight": "ffn_down.weight",
        "input_layernorm.weight": "attn_norm.weight",
        "post_attention_layernorm.weight": "ffn_norm.weight",
    }
    for i in range(layers):
        for h, g in per_layer.items():
            names[f"model.layers.{i}.{h}"] = f"blk.{i}.{g}"

    w = gguf.GGUFWriter(OUT / f"tiny_{arch}.gguf", arch=arch)
    w.add_block_count(layers)
    w.add_context_length(ctx)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_rope_freq_base(10000.0 if arch == "llama" else 1000000.0)
    w.add_layer_norm_rms_eps(1e-5 if arch == "llama" else 1e-6)
    w.add_rope_dimension_count(hd)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"t{i}" for i in range(vocab)])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    for h, a in hf.items():
        g = names[h]
        if arch == "llama" and ".attn_q." in g:
            a = permute(a, heads, heads)
        elif arch == "llama" and ".attn_k." in g:
            a = permute(a, heads, kv)
        w.add_tensor(g, np.ascontiguousarray(a))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    for h, a in hf.items():
        write_f32(OUT / f"tiny_{arch}" / f"{h}.f32", a)
    (OUT / f"tiny_{arch}.json").write_text(
        json.dumps({h: list(a.shape) for h, a in hf.items()}, indent=1, sort_keys=True) + "\n"
    )
    print(f"tiny_{arch}.gguf: {len(hf)} tensors")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--smollm2", type=Path, default=default_smollm2())
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    quants(args.smollm2)
    tiny_model("llama")
    tiny_model("qwen2")


if __name__ == "__main__":
    main()
