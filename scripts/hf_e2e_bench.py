"""HF transformers peers of `dustin-bench e2e`, on the GPU machine's python3.

Random-init Qwen2.5-7B-Instruct target (and 0.5B draft for assisted generation) from the same
config.json files, bf16, SDPA attention. Greedy `generate` of 33 new tokens after a prompt of
`ctx` random ids; decode ms/token = (t(33) - t(1)) / 32, so prefill is not counted. Assisted
generation (batch 1 only: HF does not batch it) with 4 assistant tokens: random weights make
its acceptance whatever they make it (about 0); its ms per generated token is reported as
measured. Peak memory: torch.cuda.max_memory_allocated per shape.
With --ttft, only the time to first token (`generate` of one new token: the prefill of the
whole prompt at once) per shape, no decoding and no assisted generation.
Usage: python3 hf_e2e_bench.py CONFIG_DIR [--quick] [--batches=1,8] [--ctxs=8192,32768] [--assist] [--ttft]
       [--target=Qwen2.5-1.5B-Instruct] (the target config's name; default Qwen2.5-7B-Instruct)
(one JSON line a shape; --assist runs assisted generation at batch 1 whatever the batches)
"""
import json
import sys
import time

import torch
from transformers import AutoConfig, AutoModelForCausalLM

cfg_dir = sys.argv[1]
quick = "--quick" in sys.argv
dev = "cuda"


def build(name, vocab=None):
    cfg = AutoConfig.from_pretrained(f"{cfg_dir}/{name}.config.json")
    if vocab is not None:
        # HF assisted generation wants one vocabulary: the 0.5B config lists 151936 ids, the
        # 7B 152064 (the same tokenizer, padded differently)
        cfg.vocab_size = vocab
    cfg._attn_implementation = "sdpa"
    with torch.device(dev):
        m = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    return m.eval()


def timed(fn):
    torch.cuda.synchronize()
    t = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t, out


target_name = next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--target=")),
                   "Qwen2.5-7B-Instruct")
label = target_name.split("-")[1]
target = build(target_name)
if "--ttft" in sys.argv:
    # no assisted generation: the draft is not needed
    draft = None
    vocab = target.config.vocab_size
else:
    draft = build("Qwen2.5-0.5B-Instruct", vocab=target.config.vocab_size)
    vocab = min(target.config.vocab_size, draft.config.vocab_size)
print(json.dumps({"torch": torch.__version__, "gpu": torch.cuda.get_device_name()}), flush=True)
ctxs = [32768] if quick else [8192, 16384, 32768]
for a in sys.argv:
    if a.startswith("--ctxs="):
        ctxs = [int(x) for x in a.split("=", 1)[1].split(",")]
batches = [1, 8] if quick else [1, 8, 16]
for a in sys.argv:
    if a.startswith("--batches="):
        batches = [int(x) for x in a.split("=", 1)[1].split(",")]
gen = dict(do_sample=False, pad_token_id=0, eos_token_id=None)
with torch.inference_mode():
    # warm-up (kernel selection)
    ids = torch.randint(0, vocab, (1, 512), device=dev)
    target.generate(ids, max_new_tokens=4, min_new_tokens=4, **gen)
    for ctx in ctxs:
        for b in batches:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            ids = torch.randint(0, vocab, (b, ctx), device=dev)
            if "--ttft" in sys.argv:
                try:
                    t1, _ = timed(lambda: target.generate(ids, max_new_tokens=1, min_new_tokens=1, **gen))
                    row = {"peer": "hf-generate", "model": label, "ctx": ctx, "batch": b,
                           "prefill_s": t1, "peak_gib": torch.cuda.max_memory_allocated() / 2**30}
                except torch.OutOfMemoryError:
                    row = {"peer": "hf-generate", "model": label, "ctx": ctx, "batch": b, "error": "OOM"}
                print(json.dumps(row), flush=True)
                continue
            try:
                t1, _ = timed(lambda: target.generate(ids, max_new_tokens=1, min_new_tokens=1, **gen))
                t33, _ = timed(lambda: target.generate(ids, max_new_tokens=33, min_new_tokens=33, **gen))
                ms = 1e3 * (t33 - t1) / 32
                row = {"peer": "hf-generate", "model": label, "ctx": ctx, "batch": b,
                       "prefill_s": t1, "decode_ms_per_step": ms, "tokens_per_sec": b * 1e3 / ms,
                       "peak_gib": torch.cuda.max_memory_allocated() / 2**30}
            except torch.OutOfMemoryError as e:
                row = {"peer": "hf-generate", "model": label, "ctx": ctx, "batch": b, "error": "OOM"}
            print(json.dumps(row), flush=True)
            if b == 1 or "--assist" in sys.argv:
                torch.cuda.reset_peak_memory_stats()
                kw = dict(assistant_model=draft, **gen)
                draft.generation_config.num_assistant_tokens = 4
                draft.generation_config.num_assistant_tokens_schedule = "constant"
                one = ids[:1]
                t1, _ = timed(lambda: target.generate(one, max_new_tokens=1, min_new_tokens=1, **kw))
                t33, out = timed(lambda: target.generate(one, max_new_tokens=33, min_new_tokens=33, **kw))
                ms = 1e3 * (t33 - t1) / 32
                print(json.dumps({"peer": "hf-assisted", "model": label, "ctx": ctx, "batch": 1,
                                  "ms_per_token": ms, "tokens_per_sec": 1e3 / ms,
                                  "peak_gib": torch.cuda.max_memory_allocated() / 2**30}), flush=True)
