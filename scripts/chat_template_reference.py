#!/usr/bin/env python3
"""Expected renderings of chat templates for the chat template tests:
crates/dustin-qwen/tests/fixtures/chat/templates.json.

The reference renderer is Hugging Face transformers' own (`render_jinja_template`, the
function behind `apply_chat_template`) when `transformers` is importable. Otherwise it is
jinja2 set up exactly as transformers' `_compile_jinja_template` sets it up:
`ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)` with the
`loopcontrols` extension, a `tojson` filter that is `json.dumps(x, ensure_ascii=False,
indent=indent, separators=separators, sort_keys=sort_keys)`, and the `raise_exception` and
`strftime_now` globals; rendered with `messages`, `tools=None`, `documents=None`,
`add_generation_prompt` and the tokenizer's special tokens (`bos_token`, `eos_token`), as
`render_jinja_template` calls it. Which one was used is recorded in the JSON (`reference`).

Templates:
- the `tokenizer.chat_template` metadata of the real GGUF files (read with `gguf.GGUFReader`;
  a file that is missing is skipped with a note), with the BOS and EOS token strings of their
  `tokenizer.ggml.bos_token_id` / `eos_token_id`;
- `llama3`: the Llama 3 Instruct template (BOS, `<|start_header_id|>`, `| trim`,
  `<|eot_id|>`), written out here as it ships in Llama 3's `tokenizer_config.json`;
- `features`: a template made for the test that exercises what HF templates lean on: the
  trim_blocks / lstrip_blocks whitespace rules with indented block tags, Python string
  methods (`.strip()`, `.startswith()`, `.split()`), slicing and negative indices,
  `namespace`, `tojson` (with and without `indent`, non-ASCII and HTML characters, key
  order), printing Python `None` and booleans, `tools is none`, `loop.last`, and
  `raise_exception` for a role it does not know.

Each case is one conversation rendered with `add_generation_prompt` true or false; a case
whose rendering raises records the error text instead (`error`).

Needs `pip install gguf jinja2` (scripts/requirements.txt); `transformers` is used when installed.

Usage: python3 scripts/chat_template_reference.py [--models DIR] [--out FILE]
"""

import argparse
import json
import sys
from datetime import datetime
from pathlib import Path

import jinja2
import jinja2.ext

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "crates" / "dustin-qwen" / "tests" / "fixtures" / "chat" / "templates.json"

GGUF_MODELS = [
    ("qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"),
    ("qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"),
    ("smollm2-135m-instruct", "SmolLM2-135M-Instruct.Q4_1.gguf"),
]

LLAMA3 = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{% endif %}"
)

FEATURES = """{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'].strip() %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set system_message = 'Default <system> & "prompt"' %}
    {%- set loop_messages = messages %}
{%- endif %}
{%- set ns = namespace(turns=0, words=0) %}
{{ bos_token }}[SYS] {{ system_message }} [/SYS]
{% for message in loop_messages %}
    {% if message['role'] not in ['user', 'assistant'] %}
        {{ raise_exception('Conversation roles must be user or assistant, got ' + message['role']) }}
    {% endif %}
    {% set ns.turns = ns.turns + 1 %}
    {% set ns.words = ns.words + message['content'].split() | length %}
    {% if message['role'].startswith('user') %}
[INST] {{ message['content'] | trim }} [/INST]
    {% else %}
 {{ message['content'].strip() }}{{ eos_token }}
    {% endif %}
    {% if loop.last %}
(last: {{ loop.index }} of {{ loop.length }})
    {% endif %}
{% endfor %}
turns={{ ns.turns }} words={{ ns.words }} gen={{ add_generation_prompt }} tools={{ tools }}
{% if tools is none %}no tools{% endif %}

first={{ loop_messages[0] | tojson }}
last={{ loop_messages[-1] | tojson(indent=2) }}
text={{ loop_messages[-1]['content'] | tojson }}
{% if add_generation_prompt %}
<assistant>
{% endif %}"""

SYSTEM = "You are a terse assistant. Answer in one sentence."
UNICODE = "Grüße aus Köln! 你好，世界 🙂 — naïve café, ½ ≤ π, <b>&amp;</b> 'q' \"dq\"\ttab"

CONVERSATIONS = [
    ("system_user", [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "What is the capital of France?"},
    ]),
    ("user_only", [
        {"role": "user", "content": "Write a haiku about the sea."},
    ]),
    ("multi_turn", [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Name a prime number."},
        {"role": "assistant", "content": "Seven."},
        {"role": "user", "content": "  And one larger than 100?\n"},
    ]),
    ("ends_with_assistant", [
        {"role": "user", "content": "Say hi."},
        {"role": "assistant", "content": "Hi!"},
    ]),
    ("unicode", [
        {"role": "user", "content": UNICODE},
    ]),
    ("multiline", [
        {"role": "system", "content": "  Line one.\n\n  Line two.  \n"},
        {"role": "user", "content": "def f(x):\n    return {\"a\": [x, 1.5, None]}\n"},
    ]),
]

# (conversation, add_generation_prompt) for every template
CASES = [
    ("system_user", True),
    ("system_user", False),
    ("user_only", True),
    ("multi_turn", True),
    ("ends_with_assistant", False),
    ("unicode", True),
    ("multiline", True),
]

# cases only the `features` template gets: a role it refuses
EXTRA = {
    "features": [
        ("tool_role", [
            {"role": "user", "content": "Look it up."},
            {"role": "tool", "content": "42"},
        ], True),
    ],
}


def jinja_renderer():
    """jinja2 as transformers' `_compile_jinja_template` sets it up."""
    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now

    def render(template, messages, add_generation_prompt, bos_token, eos_token):
        return env.from_string(template).render(
            messages=messages,
            tools=None,
            documents=None,
            add_generation_prompt=add_generation_prompt,
            bos_token=bos_token,
            eos_token=eos_token,
        )

    return f"jinja2 {jinja2.__version__} with transformers' chat template settings", render


def transformers_renderer():
    """transformers' own `render_jinja_template`, or None when it cannot be imported."""
    try:
        import transformers
        from transformers.utils.chat_template_utils import render_jinja_template
    except Exception:  # not installed, or too old to have render_jinja_template
        return None

    def render(template, messages, add_generation_prompt, bos_token, eos_token):
        out, _ = render_jinja_template(
            conversations=[messages],
            chat_template=template,
            add_generation_prompt=add_generation_prompt,
            bos_token=bos_token,
            eos_token=eos_token,
        )
        return out[0]

    return f"transformers {transformers.__version__} render_jinja_template", render


def gguf_templates(models: Path):
    import gguf

    out = []
    for name, file in GGUF_MODELS:
        path = models / file
        if not path.is_file():
            print(f"note: {path} not found; its template is left out", file=sys.stderr)
            continue
        r = gguf.GGUFReader(str(path))
        field = r.fields.get("tokenizer.chat_template")
        if field is None:
            print(f"note: {path} has no tokenizer.chat_template", file=sys.stderr)
            continue
        tokens = r.fields["tokenizer.ggml.tokens"].contents()

        def token(key):
            f = r.fields.get(key)
            return None if f is None else tokens[int(f.contents())]

        out.append({
            "name": name,
            "origin": f"GGUF {file}",
            "gguf_file": file,
            "template": field.contents(),
            "bos_token": token("tokenizer.ggml.bos_token_id"),
            "eos_token": token("tokenizer.ggml.eos_token_id"),
        })
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", type=Path, default=Path.home() / ".cache" / "dustin" / "models")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()

    ref = transformers_renderer() or jinja_renderer()
    label, render = ref
    templates = gguf_templates(args.models)
    templates.append({
        "name": "llama3",
        "origin": "Llama 3 Instruct tokenizer_config.json",
        "template": LLAMA3,
        "bos_token": "<|begin_of_text|>",
        "eos_token": "<|eot_id|>",
    })
    templates.append({
        "name": "features",
        "origin": "written for this test",
        "template": FEATURES,
        "bos_token": "<s>",
        "eos_token": "</s>",
    })
    convs = dict(CONVERSATIONS)
    for t in templates:
        cases = [(c, convs[c], g) for c, g in CASES] + EXTRA.get(t["name"], [])
        t["cases"] = []
        for conv, messages, gen in cases:
            case = {"conversation": conv, "messages": messages, "add_generation_prompt": gen}
            try:
                case["expected"] = render(
                    t["template"], messages, gen, t["bos_token"], t["eos_token"]
                )
            except jinja2.exceptions.TemplateError as e:
                case["error"] = str(e)
            t["cases"].append(case)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "generated_by": "scripts/chat_template_reference.py",
        "reference": label,
        "templates": templates,
    }
    args.out.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    n = sum(len(t["cases"]) for t in templates)
    print(f"wrote {args.out}: {len(templates)} templates, {n} cases ({label})")


if __name__ == "__main__":
    main()
