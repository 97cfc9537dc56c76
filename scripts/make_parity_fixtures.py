#!/usr/bin/env python3
"""Build tiny random HF `transformers` models and their reference logits for dustin's parity test.

For each fixture (see FIXTURES below) this script:

1. builds a tiny Qwen2ForCausalLM / LlamaForCausalLM from a config, with a fixed seed;
2. re-initialises EVERY parameter (weights ~ N(0, 0.2), biases ~ N(0, 0.1), RMSNorm weights
   ~ N(1, 0.1)) so that a wrong bias, norm or tying treatment changes the logits (HF's own init
   puts biases at 0 and norm weights at 1, which would hide such bugs);
3. saves it with `save_pretrained` as float32 `config.json` + `model.safetensors` into
   crates/dustin-qwen/tests/fixtures/parity/<name>/ (config.json is exactly what HF writes);
4. reloads the saved files in float64 with eager attention and records, for two fixed prompts,
   the prefill logits at every prompt position and three greedy decode steps (logits of each
   step) into reference.json;
5. reloads the saved files in float32 and checks that they reproduce the float64 reference
   (sanity check of the fixtures themselves; printed, and the script fails if it is off).

reference.json layout:
  {"dtype": "float64-reference", "seed": ..., "transformers_version": ..., "torch_version": ...,
   "cases": [{"prompt": [ids], "prefill_logits": [[vocab floats] per prompt position],
              "decode_tokens": [t1, t2, t3], "decode_logits": [[...], [...], [...]]}, ...]}
Decode semantics: t1 = argmax(prefill_logits[-1]); feeding t1 (at position len(prompt), with the
prefill KV cache) gives decode_logits[0]; t2 = argmax(decode_logits[0]); feeding t2 gives
decode_logits[1]; t3 = argmax(decode_logits[1]); feeding t3 gives decode_logits[2].

Usage (needs torch, transformers, safetensors, numpy):  python scripts/make_parity_fixtures.py
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

SEED = 20240611
REPO = Path(__file__).resolve().parent.parent
OUT_DIR = REPO / "crates" / "dustin-qwen" / "tests" / "fixtures" / "parity"

PROMPT_LENS = (11, 5)
DECODE_STEPS = 3
SIG_DIGITS = 7
# float32 fixtures vs float64 reference: tolerance for the sanity check.
F32_TOL = 1e-4
# HF float64 vs an independent NumPy float64 pass (HF keeps some float32 internals).
NUMPY_TOL = 5e-5
# Smallest allowed gap between the top two logits wherever greedy decoding picks a token.
MIN_GREEDY_MARGIN = 0.05

COMMON = dict(max_position_embeddings=256, rms_norm_eps=1e-6, hidden_act="silu")

FIXTURES = {
    # Qwen2, tied LM head, GQA group 2, non-default theta.
    "qwen2-tied": (
        Qwen2ForCausalLM,
        Qwen2Config,
        dict(
            vocab_size=96,
            hidden_size=64,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            rope_theta=50000.0,
            tie_word_embeddings=True,
        ),
    ),
    # Qwen2, untied, 7 query heads sharing 1 KV head (group 7), head_dim 8.
    "qwen2-gqa7": (
        Qwen2ForCausalLM,
        Qwen2Config,
        dict(
            vocab_size=96,
            hidden_size=56,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=7,
            num_key_value_heads=1,
            rope_theta=1000000.0,
            tie_word_embeddings=False,
        ),
    ),
    # Llama, untied, no biases, GQA group 3.
    "llama": (
        LlamaForCausalLM,
        LlamaConfig,
        dict(
            vocab_size=96,
            hidden_size=48,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=6,
            num_key_value_heads=2,
            rope_theta=10000.0,
            attention_bias=False,
            mlp_bias=False,
            tie_word_embeddings=False,
        ),
    ),
}


def round_sig(values) -> list[float]:
    """Floats rounded to SIG_DIGITS significant digits (as plain JSON numbers)."""
    return [float(f"{v:.{SIG_DIGITS}g}") for v in np.asarray(values, dtype=np.float64).ravel()]


def reinit_(model: torch.nn.Module, gen: torch.Generator) -> None:
    """Re-draws every parameter so biases and norm weights are far from HF's 0 / 1 init."""
    with torch.no_grad():
        for name, p in model.named_parameters():  # tied weights are listed once
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen, dtype=torch.float64))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen, dtype=torch.float64))
            else:
                p.copy_(0.2 * torch.randn(p.shape, generator=gen, dtype=torch.float64))


def load(path: Path, dtype: torch.dtype) -> torch.nn.Module:
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="eager")
    return model.eval()


def cache_kwarg(model: torch.nn.Module) -> str:
    """Name of the KV-cache argument: `cache` in recent transformers, `past_key_values` before."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def cache_of(out) -> object:
    return out["cache"] if "cache" in out else out.past_key_values


@torch.no_grad()
def run_case(model: torch.nn.Module, prompt: list[int]) -> dict:
    """Prefill logits at every position, then DECODE_STEPS greedy steps with the KV cache."""
    ids = torch.tensor([prompt], dtype=torch.long)
    out = model(input_ids=ids, use_cache=True)
    prefill = out.logits[0].to(torch.float64)
    past = cache_of(out)
    last = prefill[-1]
    tokens, step_logits = [], []
    for _ in range(DECODE_STEPS):
        tok = int(torch.argmax(last))
        tokens.append(tok)
        step = torch.tensor([[tok]], dtype=torch.long)
        out = model(input_ids=step, use_cache=True, **{cache_kwarg(model): past})
        past = cache_of(out)
        last = out.logits[0, -1].to(torch.float64)
        step_logits.append(last)
    return {
        "prompt": prompt,
        "prefill_logits": prefill,
        "decode_tokens": tokens,
        "decode_logits": torch.stack(step_logits),
    }


def greedy_margin(case: dict) -> float:
    """Smallest gap between the best and second-best logit over the rows whose argmax picks a
    decode token (last prefill row and all but the last decode row)."""
    rows = torch.cat([case["prefill_logits"][-1:], case["decode_logits"][:-1]])
    top = torch.topk(rows, 2, dim=-1).values
    return float((top[:, 0] - top[:, 1]).min())


def numpy_logits(out: Path, ids: list[int]) -> np.ndarray:
    """Independent float64 NumPy forward pass (no cache) over the saved config + safetensors.

    Cross-checks the HF reference and spells out the math a port must match. HF itself computes
    RMSNorm, the attention softmax and the RoPE angles in float32 even for a float64 model, so
    the two agree to a few 1e-6, not to float64 precision.
    """
    from safetensors.numpy import load_file

    c = json.loads((out / "config.json").read_text())
    w = {k: v.astype(np.float64) for k, v in load_file(out / "model.safetensors").items()}
    theta = c["rope_theta"] if "rope_theta" in c else c["rope_parameters"]["rope_theta"]
    nh, nkv = c["num_attention_heads"], c["num_key_value_heads"]
    hd = c.get("head_dim") or c["hidden_size"] // nh
    n = len(ids)

    def rms(x, name):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + c["rms_norm_eps"]) * w[name]

    def lin(x, name):
        y = x @ w[name + ".weight"].T
        return y + w[name + ".bias"] if name + ".bias" in w else y

    ang = np.arange(n)[:, None] * theta ** (-np.arange(0, hd, 2) / hd)[None]
    cos, sin = np.tile(np.cos(ang), 2), np.tile(np.sin(ang), 2)

    def rope(t):  # rotate-half
        return t * cos + np.concatenate([-t[..., hd // 2 :], t[..., : hd // 2]], -1) * sin

    x = w["model.embed_tokens.weight"][ids]
    for layer in range(c["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        h = rms(x, p + "input_layernorm.weight")
        q = rope(lin(h, p + "self_attn.q_proj").reshape(n, nh, hd).transpose(1, 0, 2))
        k = rope(lin(h, p + "self_attn.k_proj").reshape(n, nkv, hd).transpose(1, 0, 2))
        v = lin(h, p + "self_attn.v_proj").reshape(n, nkv, hd).transpose(1, 0, 2)
        k, v = np.repeat(k, nh // nkv, 0), np.repeat(v, nh // nkv, 0)  # query head i -> kv i // group
        s = q @ k.transpose(0, 2, 1) / np.sqrt(hd) + np.triu(np.full((n, n), -np.inf), 1)
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        x = x + lin((s @ v).transpose(1, 0, 2).reshape(n, nh * hd), p + "self_attn.o_proj")
        h = rms(x, p + "post_attention_layernorm.weight")
        gate = lin(h, p + "mlp.gate_proj")
        x = x + lin(gate / (1.0 + np.exp(-gate)) * lin(h, p + "mlp.up_proj"), p + "mlp.down_proj")
    head = w["lm_head.weight"] if "lm_head.weight" in w else w["model.embed_tokens.weight"]
    return rms(x, "model.norm.weight") @ head.T


def make_fixture(name: str, model_cls, config_cls, kwargs: dict, gen: torch.Generator) -> dict:
    out = OUT_DIR / name
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)

    config = config_cls(**COMMON, **kwargs)
    model = model_cls(config).to(torch.float32)
    reinit_(model, gen)
    if model_cls is Qwen2ForCausalLM:
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                assert proj.bias is not None and proj.bias.abs().min() > 0, "qwen2 q/k/v bias must be non-zero"
    if config.tie_word_embeddings:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    model.save_pretrained(out, safe_serialization=True)
    for f in os.listdir(out):  # keep only what the Rust loader reads
        if f not in ("config.json", "model.safetensors"):
            os.remove(out / f)

    # Reference: reload the saved float32 weights, compute in float64. A prompt whose greedy
    # choices are near-ties is redrawn, so that an implementation within tolerance picks the
    # same decode tokens.
    ref_model = load(out, torch.float64)
    cases = []
    for n in PROMPT_LENS:
        for _ in range(100):
            case = run_case(ref_model, torch.randint(0, config.vocab_size, (n,), generator=gen).tolist())
            if greedy_margin(case) >= MIN_GREEDY_MARGIN:
                break
        else:
            sys.exit(f"{name}: no prompt of length {n} with greedy margin >= {MIN_GREEDY_MARGIN}")
        cases.append(case)

    # Sanity check: the float32 fixture reproduces the float64 reference.
    f32_model = load(out, torch.float32)
    max_diff, max_ref, tok_ok, margin = 0.0, 0.0, True, float("inf")
    for c in cases:
        c32 = run_case(f32_model, c["prompt"])
        for key in ("prefill_logits", "decode_logits"):
            max_diff = max(max_diff, float((c32[key] - c[key]).abs().max()))
            max_ref = max(max_ref, float(c[key].abs().max()))
        tok_ok &= c32["decode_tokens"] == c["decode_tokens"]
        margin = min(margin, greedy_margin(c))
    print(
        f"{name}: max |f32 - f64| = {max_diff:.3e} (max |logit| {max_ref:.3f}), "
        f"greedy tokens equal: {tok_ok}, min greedy top-2 logit margin {margin:.4f}"
    )
    if not (max_diff < F32_TOL and tok_ok):
        sys.exit(f"{name}: float32 fixture does not reproduce the float64 reference")
    # Independent check: NumPy float64 over prompt + decode tokens in one pass (no KV cache).
    np_diff = 0.0
    for c in cases:
        logits = numpy_logits(out, c["prompt"] + c["decode_tokens"])
        ref = torch.cat([c["prefill_logits"], c["decode_logits"]]).numpy()
        np_diff = max(np_diff, float(np.abs(logits - ref).max()))
    print(f"{name}: max |numpy f64 (no cache) - HF f64| = {np_diff:.3e}")
    if not np_diff < NUMPY_TOL:
        sys.exit(f"{name}: HF reference and the NumPy re-implementation disagree")

    eos = config.eos_token_id
    eos = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
    for c in cases:
        assert not set(c["decode_tokens"]) & set(eos), f"{name}: greedy decode hit eos {eos}"

    reference = {
        "dtype": "float64-reference",
        "seed": SEED,
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "model_class": model_cls.__name__,
        "attn_implementation": "eager",
        "significant_digits": SIG_DIGITS,
        "precision": "HF float64 model with eager attention; HF computes RMSNorm, softmax and RoPE "
        "angles in float32 internally, so values match a pure float64 computation to ~5e-6",
        "decode": "t1=argmax(prefill_logits[-1]); decode_logits[i] = logits after feeding decode_tokens[i] "
        "with the KV cache; t(i+2)=argmax(decode_logits[i])",
        "cases": [
            {
                "prompt": c["prompt"],
                "prefill_logits": [round_sig(row) for row in c["prefill_logits"]],
                "decode_tokens": c["decode_tokens"],
                "decode_logits": [round_sig(row) for row in c["decode_logits"]],
            }
            for c in cases
        ],
    }
    with open(out / "reference.json", "w") as f:
        json.dump(reference, f, separators=(",", ":"))
        f.write("\n")
    sizes = {f: (out / f).stat().st_size for f in sorted(os.listdir(out))}
    print(f"{name}: " + ", ".join(f"{f} {s / 1024:.1f} KiB" for f, s in sizes.items()))
    return sizes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.parse_args()
    torch.use_deterministic_algorithms(True)
    gen = torch.Generator().manual_seed(SEED)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, seed {SEED}")
    total = 0
    for name, (model_cls, config_cls, kwargs) in FIXTURES.items():
        total += sum(make_fixture(name, model_cls, config_cls, kwargs, gen).values())
    print(f"total {total / 1024:.1f} KiB in {OUT_DIR.relative_to(REPO)}")


if __name__ == "__main__":
    main()
