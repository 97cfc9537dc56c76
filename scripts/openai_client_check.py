"""Calls a running `dustin serve` with the official `openai` client: a completion, a chat
completion and a streamed chat completion, each greedy, and checks that the streamed chat
text equals the whole one.

    python scripts/openai_client_check.py http://127.0.0.1:8080/v1 MODEL_ID
"""

import sys

from openai import OpenAI


def main() -> None:
    base, model = sys.argv[1], sys.argv[2]
    client = OpenAI(base_url=base, api_key="unused")
    ids = [m.id for m in client.models.list().data]
    assert ids == [model], ids

    c = client.completions.create(model=model, prompt="fn main() {", max_tokens=12, temperature=0)
    assert c.choices[0].finish_reason in ("stop", "length"), c
    assert c.usage.completion_tokens >= 1, c
    print("completion:", repr(c.choices[0].text))

    messages = [{"role": "user", "content": "Say hello in three words."}]
    chat = client.chat.completions.create(model=model, messages=messages, max_tokens=16, temperature=0)
    whole = chat.choices[0].message.content
    assert chat.choices[0].message.role == "assistant", chat
    print("chat:", repr(whole))

    parts = []
    finish = None
    for chunk in client.chat.completions.create(
        model=model, messages=messages, max_tokens=16, temperature=0, stream=True
    ):
        for ch in chunk.choices:
            parts.append(ch.delta.content or "")
            finish = ch.finish_reason or finish
    streamed = "".join(parts)
    print("streamed chat:", repr(streamed), finish)
    assert streamed == whole, (streamed, whole)
    assert finish in ("stop", "length"), finish
    print("openai client: 3 calls ok")


if __name__ == "__main__":
    main()
