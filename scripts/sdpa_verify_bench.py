"""PyTorch SDPA reference timing for dense verify attention (dustin-kernels benchmark).

Same shapes as `dustin-kernels-gpu bench`: Qwen2.5-7B (28 q / 4 kv heads) and 72B (64 / 8),
head_dim 128, bf16, batch 1/8/16, context 8k/16k/32k, 5 new query tokens causal among
themselves (query i sees keys j <= ctx + i). GQA through `enable_gqa=True` (no K/V expansion
by the caller). CUDA events around 20 calls after 3 warm-ups. Prints one JSON line a shape.
Usage: python3 sdpa_verify_bench.py [--quick]
"""
import json
import sys

import torch
import torch.nn.functional as F

quick = "--quick" in sys.argv
models = [("7B", 28, 4), ("72B", 64, 8)]
batches = [8] if quick else [1, 8, 16]
ctxs = [32768] if quick else [8192, 16384, 32768]
n, d = 5, 128
dev = "cuda"
for name, hq, kvh in models:
    for b in batches:
        for ctx in ctxs:
            L = ctx + n
            q = torch.randn(b, hq, n, d, device=dev, dtype=torch.bfloat16)
            k = torch.randn(b, kvh, L, d, device=dev, dtype=torch.bfloat16)
            v = torch.randn(b, kvh, L, d, device=dev, dtype=torch.bfloat16)
            j = torch.arange(L, device=dev)
            i = torch.arange(n, device=dev)
            mask = (j[None, :] <= ctx + i[:, None])[None, None]
            g = hq // kvh
            # variant 1: GQA inside SDPA; variant 2: K/V expanded to the query heads beforehand
            # (the expansion is not timed; SDPA then reads g times the KV bytes)
            ke = k.repeat_interleave(g, dim=1)
            ve = v.repeat_interleave(g, dim=1)
            variants = {
                "gqa": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True),
                "expanded": lambda: F.scaled_dot_product_attention(q, ke, ve, attn_mask=mask),
            }
            res = {"model": name, "batch": b, "ctx": ctx}
            kv = 2 * b * kvh * L * d * 2
            for vname, f in variants.items():
                for _ in range(3):
                    f()
                torch.cuda.synchronize()
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                iters = 20
                s.record()
                for _ in range(iters):
                    f()
                e.record()
                torch.cuda.synchronize()
                us = s.elapsed_time(e) * 1e3 / iters
                res[f"sdpa_{vname}_us"] = round(us, 2)
                res[f"sdpa_{vname}_tbs"] = round(kv / us / 1e6, 3)
            print(json.dumps(res), flush=True)
            del q, k, v, ke, ve
            torch.cuda.empty_cache()
