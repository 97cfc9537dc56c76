"""PyTorch side of `dustin-kernels-gpu gemm` (the peer our GEMMs are measured against), same shapes.

bf16 `x @ w` at the projection shapes of Qwen2.5-7B and 72B (prefill rows 4k/16k/32k, decode /
verify rows 8/40/128; 30 warm-ups, mean of 10 by CUDA events) and SDPA causal prefill (28 heads,
d 128, 4k/16k/32k). One JSON line a shape, the same keys as the Rust side.
Usage: python3 gemm_prefill_bench.py [--quick] [--sdpa-only] [--decode-only]
(--decode-only: the decode / verify rows 1, 8, 16, 40, 128 only, no SDPA)
"""
import json
import sys

import torch
import torch.nn.functional as F

quick = "--quick" in sys.argv
sdpa_only = "--sdpa-only" in sys.argv
dev = "cuda"
prefill = [16384] if quick else [4096, 16384, 32768]
decode = [8, 40, 128]
decode_only = "--decode-only" in sys.argv
if decode_only:
    prefill, decode = [], [1, 8, 16, 40, 128]


def timed(fn, warm, reps):
    for _ in range(warm):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / reps  # microseconds


with torch.inference_mode():
    for name, h, inter, qo, kvo in [("7B", 3584, 18944, 3584, 512), ("72B", 8192, 29568, 8192, 1024)]:
        for k, n, what in [(h, qo, "q/o"), (h, kvo, "k/v"), (h, inter, "gate/up"), (inter, h, "down")]:
            if sdpa_only:
                continue
            w = torch.randn(k, n, device=dev, dtype=torch.bfloat16) * 0.02
            for m in prefill + decode:
                x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
                us = timed(lambda: x @ w, 30, 10)
                print(json.dumps({"op": "matmul", "peer": "torch", "model": name, "proj": what,
                                  "m": m, "k": k, "n": n, "us": round(us, 2),
                                  "tflops": round(2 * m * k * n / us / 1e6, 2),
                                  "weight_tbps": round(2 * k * n / us / 1e6, 3)}), flush=True)
        # the products of one input as a model runs them: q, k, v (with Qwen2.5's biases, as
        # addmm) and gate, up; compared with our prefill_linear_many rows ("cublas_many")
        for what, widths, bias in [("q+k+v", [qo, kvo, kvo], True), ("gate+up", [inter, inter], False)]:
            if sdpa_only:
                continue
            ws = [torch.randn(h, n, device=dev, dtype=torch.bfloat16) * 0.02 for n in widths]
            bs = [torch.randn(n, device=dev, dtype=torch.bfloat16) * 0.02 for n in widths]
            for m in prefill:
                x = torch.randn(m, h, device=dev, dtype=torch.bfloat16)
                if bias:
                    run = lambda: [torch.addmm(b, x, w) for w, b in zip(ws, bs)]
                else:
                    run = lambda: [x @ w for w in ws]
                us = timed(run, 30, 10)
                n = sum(widths)
                print(json.dumps({"op": "matmul_many", "peer": "torch", "model": name, "proj": what,
                                  "m": m, "k": h, "n": n, "us": round(us, 2),
                                  "tflops": round(2 * m * h * n / us / 1e6, 2)}), flush=True)
    heads, d = 28, 128
    for n in [] if decode_only else prefill:
        q, k, v = (torch.randn(1, heads, n, d, device=dev, dtype=torch.bfloat16) for _ in range(3))
        us = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), 3, 5)
        print(json.dumps({"op": "attention-causal-prefill", "peer": "torch", "heads": heads, "d": d,
                          "n": n, "us": round(us, 1),
                          "tflops": round(2 * 2 * heads * d * n * n / 2 / us / 1e6, 2)}), flush=True)
