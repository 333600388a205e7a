"""Call a running ``specprefill serve`` with the official ``openai`` client, then drive it from a pipeline.

Start the server first (it loads the bundled SmolLM2-135M on CPU), then run this script::

    specprefill serve --model smollm2-135m --port 8000 &
    python examples/server_client.py [--base-url http://127.0.0.1:8000/v1] [--api-key KEY]

It shows the three ways in:

1. a chat completion whose compression is controlled per request through ``extra_body``;
2. the same request streamed, ending with the usage chunk;
3. a local `Pipeline` (draft scoring here) whose target is the server (`OpenAIBackend`, exact
   positions over HTTP).
"""

from __future__ import annotations

import argparse
import os

from openai import OpenAI
from openai.types.chat import ChatCompletionMessageParam

from specprefill_sdk.eval.corpora import haystack

QUESTION = "In one sentence: what is this text about?"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1", help="the server's API root")
    parser.add_argument("--api-key", default=os.environ.get("SPECPREFILL_API_KEY", "none"))
    parser.add_argument("--chars", type=int, default=3000, help="length of the essay in characters")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--keep", type=float, default=0.2, help="keep rate asked for in the request")
    parser.add_argument("--no-pipeline", action="store_true", help="skip part 3 (it loads the draft locally)")
    args = parser.parse_args(argv)

    client = OpenAI(base_url=args.base_url, api_key=args.api_key)
    model = client.models.list().data[0].id
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": f"{haystack(args.chars)}\n\n{QUESTION}"}]
    control = {"specprefill": {"keep_rate": args.keep, "look_ahead": 8}}

    # 1. One request, compressed as this request asks.
    answer = client.chat.completions.create(
        model=model,
        messages=messages,
        max_tokens=args.max_tokens,
        extra_body=control,
    )
    usage = answer.model_dump()["usage"]
    sp = usage["specprefill"]
    print(f"[chat] {answer.choices[0].message.content!r}")
    print(
        f"[chat] prompt {usage['prompt_tokens']} tokens, kept {sp['kept_tokens']} ({sp['keep_ratio']:.0%}), "
        f"scoring {sp['score_ms']:.0f} ms, prefill {sp['prefill_ms']:.0f} ms, fallback {sp['fallback']}"
    )

    # 2. The same request, streamed; the last chunk carries the usage.
    print("[stream] ", end="", flush=True)
    stream = client.chat.completions.create(
        model=model,
        messages=messages,
        max_tokens=args.max_tokens,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=control,
    )
    for chunk in stream:
        if chunk.choices:
            print(chunk.choices[0].delta.content or "", end="", flush=True)
        elif chunk.usage is not None:
            kept = chunk.model_dump()["usage"]["specprefill"]["kept_tokens"]
            print(f"\n[stream] kept {kept} of {chunk.usage.prompt_tokens} prompt tokens")

    # 3. A local pipeline scores and selects; the server prefills the kept ids at their positions.
    if not args.no_pipeline:
        from specprefill_sdk.backends import OpenAIBackend
        from specprefill_sdk.policies import load_pipeline

        remote = OpenAIBackend(args.base_url, model=model, tokenizer=model, api_key=args.api_key)
        pipe = load_pipeline("paper", model=model, backend=remote, keep_rate=args.keep)
        result = pipe.generate(messages, max_tokens=args.max_tokens)
        print(f"[pipeline, {remote.mode} mode] {result.text!r}")
        print(f"[pipeline] kept {result.usage.kept_tokens} of {result.usage.prompt_tokens} prompt tokens")
        remote.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
