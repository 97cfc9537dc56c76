"""HF transformers on PyTorch (CPU, float32) on a prompt file: prefill and decode tokens/s.

The peer row of `scripts/cpu_peers.sh`: the same GGUF file `dustin generate` reads
(transformers dequantises it to float32 with the `gguf` package), SDPA attention, greedy
decoding with the KV cache, `--threads` intra-op threads. Prints one JSON line:
{"prompt_tokens", "prefill_s", "prefill_tok_s", "decode_tokens", "decode_s", "decode_tok_s"}.

Prefill is one forward pass over the whole prompt (as `model.generate` runs it); decode is
`--new-tokens` single-token steps after it (the first token comes from the prefill's logits,
as in `dustin generate`). Needs `pip install -r scripts/requirements.txt`.
"""

import argparse
import json
import os
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")
    ap.add_argument("--prompt-file", type=Path, required=True)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument(
        "--cache",
        type=Path,
        default=Path(os.environ.get("DUSTIN_CACHE", Path.home() / ".cache" / "dustin")),
    )
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    path = args.cache / "models" / args.model
    if not path.is_file():
        raise SystemExit(f"--model {path}: no such file (dustin fetch-model fetches it)")
    tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32, attn_implementation="sdpa"
    ).eval()
    ids = tok(args.prompt_file.read_text(encoding="utf-8"), add_special_tokens=False)["input_ids"]
    x = torch.tensor([ids], dtype=torch.long)
    with torch.inference_mode():
        t0 = time.perf_counter()
        out = model(x, use_cache=True)
        prefill = time.perf_counter() - t0
        past = out.past_key_values
        nxt = out.logits[0, -1].argmax().reshape(1, 1)
        t0 = time.perf_counter()
        for _ in range(args.new_tokens):
            o = model(nxt, past_key_values=past, use_cache=True)
            past = o.past_key_values
            nxt = o.logits[0, -1].argmax().reshape(1, 1)
        decode = time.perf_counter() - t0
    print(
        json.dumps(
            {
                "prompt_tokens": len(ids),
                "prefill_s": round(prefill, 3),
                "prefill_tok_s": round(len(ids) / prefill, 2),
                "decode_tokens": args.new_tokens,
                "decode_s": round(decode, 3),
                "decode_tok_s": round(args.new_tokens / decode, 2),
                "threads": args.threads,
                "torch": torch.__version__,
            }
        )
    )


if __name__ == "__main__":
    main()
