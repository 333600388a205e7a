"""litellm proxy: start ``specprefill serve`` and a litellm proxy with our callback, then ask through the proxy.

Needs ``pip install "specprefill-sdk[server,litellm]" "litellm[proxy]" openai``. Both servers run on
127.0.0.1 and stop at the end. The model ``smollm2`` reaches the specprefill server with the
``specprefill`` extension (exact positions); ``smollm2-text`` is shortened by the proxy (text mode),
as any OpenAI-compatible endpoint would be.

    python examples/litellm_proxy.py [--max-tokens 16] [--json] [--stream]

Each answer shows the usage (``usage.specprefill``: what the server prefilled) and, in text mode,
the proxy's ``x-specprefill-*`` response headers (what the callback kept).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
from openai import OpenAI

from specprefill_sdk.eval.corpora import haystack

HERE = Path(__file__).resolve().parent
QUESTION = "What is the text about? Answer in one sentence."
_PROXY = "import sys; from litellm.proxy.proxy_cli import run_server; sys.exit(run_server())"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def process(args: list[str], env: dict[str, str], health: str, log: Path, timeout: float = 300.0) -> Iterator[None]:
    """Run ``args`` until the block ends; wait until ``health`` answers 200."""
    with log.open("wb") as out:
        proc = subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=HERE)
        try:
            deadline = time.monotonic() + timeout
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"{args[0]} exited with {proc.returncode}; see {log}")
                try:
                    if httpx.get(health, timeout=2.0).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{health} did not answer in {timeout:.0f}s; see {log}")
                time.sleep(0.5)
            yield
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chars", type=int, default=2000, help="length of the text in the prompt")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--logs", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")), help="log folder")
    parser.add_argument("--json", action="store_true", help="print one JSON object per answer")
    parser.add_argument("--stream", action="store_true", help="also ask each model with a streamed request")
    parser.add_argument("--config", type=Path, default=HERE / "litellm_config.yaml", help="the proxy's config")
    args = parser.parse_args(argv)

    server_port, proxy_port = free_port(), free_port()
    key = "sk-" + secrets.token_hex(24)
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "SPECPREFILL_API_BASE": f"http://127.0.0.1:{server_port}/v1",
        "LITELLM_MASTER_KEY": key,
    }
    adapters = HERE.parent / "adapters"  # a source checkout; an installed package needs no path
    if adapters.is_dir():
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(adapters), str(HERE.parent), env.get("PYTHONPATH")]))
    server = [sys.executable, "-m", "specprefill_sdk", "serve", "--port", str(server_port), "--log-level", "warning"]
    proxy = [
        sys.executable,
        "-c",
        _PROXY,
        "--config",
        str(args.config),
        "--host",
        "127.0.0.1",
        "--port",
        str(proxy_port),
    ]
    messages = [{"role": "user", "content": f"{haystack(args.chars)}\n\n{QUESTION}"}]

    with ExitStack() as stack:
        stack.enter_context(
            process(server, env, f"http://127.0.0.1:{server_port}/health", args.logs / "specprefill-serve.log")
        )
        stack.enter_context(
            process(proxy, env, f"http://127.0.0.1:{proxy_port}/health/liveliness", args.logs / "litellm-proxy.log")
        )
        client = OpenAI(base_url=f"http://127.0.0.1:{proxy_port}/v1", api_key=key, timeout=600)
        for model in ("smollm2", "smollm2-text"):
            raw = client.chat.completions.with_raw_response.create(
                model=model,
                messages=messages,  # type: ignore[arg-type]
                max_tokens=args.max_tokens,
            )
            reply = raw.parse()
            record = {
                "model": model,
                "answer": reply.choices[0].message.content or "",
                "usage": reply.usage.model_dump() if reply.usage else {},
                "headers": {k: v for k, v in raw.headers.items() if k.startswith("x-specprefill-")},
            }
            if args.stream:
                pieces, usage = [], {}
                stream = client.chat.completions.create(
                    model=model,
                    messages=messages,  # type: ignore[arg-type]
                    max_tokens=args.max_tokens,
                    stream=True,
                    stream_options={"include_usage": True},
                )
                for chunk in stream:
                    pieces.extend(c.delta.content or "" for c in chunk.choices)
                    if chunk.usage is not None:
                        usage = chunk.usage.model_dump()
                record["stream_answer"], record["stream_usage"] = "".join(pieces), usage
            if args.json:
                print(json.dumps(record))
                continue
            extension = record["usage"].get("specprefill") or {}
            print(f"{model}: {record['answer'].strip()!r}")
            print(
                f"    the server read {record['usage'].get('prompt_tokens')} prompt tokens "
                f"and prefilled {extension.get('kept_tokens')} of them"
            )
            if record["headers"]:
                print(f"    the proxy kept {record['headers'].get('x-specprefill-kept-tokens')} tokens in text mode")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
