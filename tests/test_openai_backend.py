"""`OpenAIBackend`: rendering kept spans, retries against real flaky HTTP servers, and both modes
against the real server process (positions mode gives the in-process pipeline's greedy answer).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from server_utils import ServerProcess, free_port, serve_in_thread, start_server
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from specprefill_sdk.backends.openai import OpenAIBackend, render_kept_messages, render_kept_text
from specprefill_sdk.errors import (
    BackendUnavailableError,
    ContextTooLongError,
    InvalidRequestError,
    NotFoundError,
    PolicyError,
)
from specprefill_sdk.types import CompressedPrompt, SamplingParams, Selection

MODEL = "smollm2-135m"
KEY = "backend-key"


@pytest.fixture(scope="module")
def tok() -> Any:
    from transformers import AutoTokenizer

    from specprefill_sdk.models import resolve_model_path

    return AutoTokenizer.from_pretrained(str(resolve_model_path(MODEL, progress=False)))


def _keep(prompt: Any, indices: list[int]) -> CompressedPrompt:
    sel = Selection(indices=tuple(indices), n=prompt.n, protected=(False,) * len(indices))
    return CompressedPrompt.from_selection(prompt, sel)


# ----------------------------------------------------------------------------- rendering (no server)
def test_text_mode_renders_kept_spans_with_the_separator(tok: Any) -> None:
    from specprefill_sdk.prompt import build_prompt

    prompt = build_prompt(tok, "one two three four five six")
    n = prompt.n
    compressed = _keep(prompt, [0, 1, n - 2, n - 1])
    text = render_kept_text(compressed, tok, separator=" [...] ")
    assert text.split() == ["one", "two", "[...]", "five", "six"]
    assert render_kept_text(CompressedPrompt.dense(prompt), tok) == prompt.text
    ids = prompt.token_ids
    bare = CompressedPrompt((ids[0], ids[1], ids[3]), (0, 1, 3), n)  # no Prompt: decoded run by run
    assert render_kept_text(bare, tok, separator="|") == "one two| four"


def test_text_mode_renders_messages_from_their_kept_content(tok: Any) -> None:
    from specprefill_sdk.prompt import build_prompt

    messages = [
        {"role": "system", "content": "You answer briefly."},
        {"role": "user", "content": "one two three four five six seven eight nine ten"},
        {"role": "assistant", "content": "Sure."},
        {"role": "user", "content": "Which number comes first?"},
    ]
    prompt = build_prompt(tok, messages)
    content = {
        i: [t for t in range(prompt.n) if prompt.message_index[t] == i and prompt.roles[t] != "template"]
        for i in range(4)
    }
    keep = content[1][:2] + content[1][-2:] + content[3] + list(range(prompt.generation_start, prompt.n))
    rendered = render_kept_messages(_keep(prompt, sorted(keep)), tok, separator=" … ")
    assert [m["role"] for m in rendered] == ["system", "user", "assistant", "user"]
    # Nothing kept: sent empty, so the turns keep their order.
    assert rendered[0]["content"] == rendered[2]["content"] == ""
    assert rendered[1]["content"].split() == ["one", "two", "…", "nine", "ten"]
    assert rendered[3]["content"] == "Which number comes first?"
    assert render_kept_messages(CompressedPrompt.dense(prompt), tok) == messages
    with pytest.raises(InvalidRequestError):
        render_kept_messages(CompressedPrompt((1, 2), (0, 1), 2), tok)


def test_constructor_rejects_bad_arguments(tok: Any) -> None:
    with pytest.raises(InvalidRequestError):
        OpenAIBackend("localhost:8000", model=MODEL, tokenizer=tok)
    with pytest.raises(InvalidRequestError):
        OpenAIBackend("http://127.0.0.1:1/v1", model=MODEL, tokenizer=tok, mode="exact")  # type: ignore[arg-type]
    with pytest.raises(InvalidRequestError):
        OpenAIBackend("http://127.0.0.1:1/v1", model=MODEL, tokenizer=object())


# ----------------------------------------------------------------------------- retries (real flaky servers)
class Flaky:
    """A small OpenAI-shaped app whose completions route fails ``failures`` times with ``status``."""

    def __init__(self, failures: int, status: int, headers: dict[str, str] | None = None) -> None:
        self.failures, self.status, self.headers = failures, status, headers or {}
        self.calls = 0
        self.bodies: list[dict[str, Any]] = []
        self.app = Starlette(
            routes=[
                Route("/health", lambda r: JSONResponse({"status": "ok"})),
                Route("/v1/models", lambda r: JSONResponse({"object": "list", "data": [{"id": MODEL}]})),
                Route("/v1/completions", self.complete, methods=["POST"]),
                Route("/v1/chat/completions", self.complete, methods=["POST"]),
            ]
        )

    async def complete(self, request: Request) -> Response:
        self.calls += 1
        self.bodies.append(await request.json())
        if self.calls <= self.failures:
            error = {"error": {"message": "busy", "type": "x", "param": None, "code": None}}
            return JSONResponse(error, status_code=self.status, headers=self.headers)
        if self.bodies[-1].get("stream"):
            chunks = [
                {"id": "c", "object": "text_completion", "model": MODEL,
                 "choices": [{"index": 0, "text": " blue", "finish_reason": None}]},
                {"id": "c", "object": "text_completion", "model": MODEL,
                 "choices": [{"index": 0, "text": "", "finish_reason": "stop"}]},
            ]  # fmt: skip
            events = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
            return Response(events, media_type="text/event-stream")
        return JSONResponse(
            {
                "id": "c",
                "object": "text_completion",
                "model": MODEL,
                "choices": [{"index": 0, "text": " blue", "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
            }
        )


def _compressed(tok: Any) -> CompressedPrompt:
    from specprefill_sdk.prompt import build_prompt

    return CompressedPrompt.dense(build_prompt(tok, "The sky is"))


@pytest.mark.parametrize(("status", "headers"), [(503, {}), (429, {"Retry-After": "0"}), (500, {})])
def test_retries_on_429_and_5xx_then_succeeds(tok: Any, status: int, headers: dict[str, str]) -> None:
    flaky = Flaky(failures=2, status=status, headers=headers)
    with serve_in_thread(flaky.app) as base:
        backend = OpenAIBackend(f"{base}/v1", model=MODEL, tokenizer=tok, max_retries=3, backoff=0.01)
        assert backend.mode == "text"  # no specprefill capability advertised
        completion = backend.generate(_compressed(tok), SamplingParams(max_tokens=2))
    assert flaky.calls == 3
    assert completion.text == " blue" and completion.finish_reason == "stop"
    assert completion.usage.prompt_tokens == _compressed(tok).n and completion.usage.completion_tokens == 1
    assert flaky.bodies[0]["prompt"] == "The sky is" and flaky.bodies[0]["max_tokens"] == 2


@pytest.mark.parametrize(
    ("retry_after", "max_backoff", "logged"),
    [("1", 8.0, "retrying in 1.00s"), ("30", 0.5, "retrying in 0.50s"), ("soon", 8.0, "retrying in 0.0")],
    ids=["honoured", "capped", "unreadable-falls-back-to-backoff"],
)
def test_a_429_waits_what_its_retry_after_says(
    tok: Any, caplog: pytest.LogCaptureFixture, retry_after: str, max_backoff: float, logged: str
) -> None:
    # The pause is read from the log line that announces it (backoff alone would be about 0.01 s).
    flaky = Flaky(failures=1, status=429, headers={"Retry-After": retry_after})
    with serve_in_thread(flaky.app) as base, caplog.at_level("INFO", logger="specprefill_sdk.backends.openai"):
        backend = OpenAIBackend(
            f"{base}/v1", model=MODEL, tokenizer=tok, mode="text", max_retries=1, backoff=0.01, max_backoff=max_backoff
        )
        assert backend.generate(_compressed(tok), SamplingParams(max_tokens=2)).text == " blue"
    retries = [r.getMessage() for r in caplog.records if "retrying in" in r.getMessage()]
    assert len(retries) == 1 and logged in retries[0], retries
    assert flaky.calls == 2


def test_streams_retry_before_the_first_byte_sync_and_async(tok: Any) -> None:
    flaky = Flaky(failures=2, status=503)
    with serve_in_thread(flaky.app) as base:
        backend = OpenAIBackend(f"{base}/v1", model=MODEL, tokenizer=tok, mode="text", max_retries=3, backoff=0.01)
        chunks = list(backend.stream(_compressed(tok), SamplingParams(max_tokens=2)))
        assert flaky.calls == 3 and "".join(c.text for c in chunks) == " blue"
        flaky.calls = 0

        async def collect() -> list[Any]:
            return [c async for c in backend.astream(_compressed(tok), SamplingParams(max_tokens=2))]

        chunks = asyncio.run(collect())
        assert flaky.calls == 3 and "".join(c.text for c in chunks) == " blue"
        flaky.calls, flaky.failures, flaky.status = 0, 100, 400
        with pytest.raises(InvalidRequestError, match="busy"):
            list(backend.stream(_compressed(tok), SamplingParams(max_tokens=2)))
        assert flaky.calls == 1  # a client error is not retried
    assert all(b["stream"] for b in flaky.bodies)


def test_gives_up_with_backend_unavailable(tok: Any) -> None:
    flaky = Flaky(failures=100, status=503)
    with serve_in_thread(flaky.app) as base:
        backend = OpenAIBackend(f"{base}/v1", model=MODEL, tokenizer=tok, mode="text", max_retries=2, backoff=0.01)
        with pytest.raises(BackendUnavailableError, match="3 attempts"):
            backend.generate(_compressed(tok), SamplingParams(max_tokens=2))
        with pytest.raises(BackendUnavailableError):
            asyncio.run(backend.agenerate(_compressed(tok), SamplingParams(max_tokens=2)))
    assert flaky.calls == 6


def test_client_errors_are_not_retried(tok: Any) -> None:
    flaky = Flaky(failures=100, status=400)
    with serve_in_thread(flaky.app) as base:
        backend = OpenAIBackend(f"{base}/v1", model=MODEL, tokenizer=tok, mode="text", max_retries=3, backoff=0.01)
        with pytest.raises(InvalidRequestError, match="busy"):
            backend.generate(_compressed(tok), SamplingParams(max_tokens=2))
    assert flaky.calls == 1


def test_vllm_wire_sends_the_layout_in_vllm_xargs(tok: Any) -> None:
    from specprefill_sdk.prompt import build_prompt

    prompt = build_prompt(tok, "one two three four five six seven eight")
    compressed = _keep(prompt, [0, 1, 5, prompt.n - 1])
    flaky = Flaky(failures=0, status=200)
    with serve_in_thread(flaky.app) as base:
        backend = OpenAIBackend(f"{base}/v1", model=MODEL, tokenizer=tok, wire="vllm")
        assert backend.mode == "positions"
        backend.generate(compressed, SamplingParams(max_tokens=3))
    body = flaky.bodies[0]
    assert body["prompt"] == list(compressed.token_ids) and "specprefill" not in body
    assert body["vllm_xargs"]["specprefill_n"] == prompt.n
    assert body["vllm_xargs"]["specprefill_spans"] == [0, 2, 5, 6, prompt.n - 1, prompt.n]
    assert body["cache_salt"].startswith("specprefill-")
    with pytest.raises(InvalidRequestError):
        OpenAIBackend(f"{base}/v1", model=MODEL, tokenizer=tok, wire="vllm", mode="text")


def test_connection_refused_gives_backend_unavailable(tok: Any) -> None:
    backend = OpenAIBackend(
        f"http://127.0.0.1:{free_port()}/v1",
        model=MODEL,
        tokenizer=tok,
        mode="positions",
        max_retries=1,
        backoff=0.01,
        timeout=5,
    )
    with pytest.raises(BackendUnavailableError, match="ConnectError"):
        backend.generate(_compressed(tok), SamplingParams(max_tokens=2))


# ----------------------------------------------------------------------------- against our server
@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("server") / "server.log"
    proc = start_server(["--model", MODEL, "--device", "cpu", "--dtype", "auto", "--api-key", KEY], log)
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def local(smollm: Any) -> Any:
    """The in-process pipeline with the same model, dtype and policy as the server."""
    from specprefill_sdk.policies import load_pipeline

    return load_pipeline("paper", model=smollm)


@pytest.fixture(scope="module")
def messages() -> list[dict[str, str]]:
    from specprefill_sdk.eval.corpora import haystack

    return [{"role": "user", "content": haystack(1500) + "\n\nWhat is the main point of this text?"}]


@pytest.mark.slow
def test_auto_mode_detects_positions_on_our_server(server: ServerProcess, tok: Any) -> None:
    backend = OpenAIBackend(server.api, model=MODEL, tokenizer=MODEL, api_key=KEY)
    assert backend.mode == "positions" and backend.capabilities.supports_position_ids
    assert backend.max_context == 8192
    wrong = OpenAIBackend(server.api, model=MODEL, tokenizer=tok, api_key="nope", max_retries=0)
    with pytest.raises(BackendUnavailableError, match="API key"):
        _ = wrong.mode


@pytest.mark.slow
def test_positions_mode_gives_the_in_process_greedy_answer(
    server: ServerProcess, local: Any, messages: list[dict[str, str]]
) -> None:
    from specprefill_sdk.pipeline import Pipeline

    params = SamplingParams(max_tokens=8)
    compressed = local.compress(messages)
    assert compressed.kept < compressed.n
    expected = local.backend.generate(compressed, params)
    remote = OpenAIBackend(server.api, model=MODEL, tokenizer=local.backend.tokenizer, mode="positions", api_key=KEY)
    got = remote.generate(compressed, params)
    assert got.text == expected.text and got.token_ids == expected.token_ids
    assert got.usage.prompt_tokens == compressed.n and got.usage.kept_tokens == compressed.kept
    # The whole pipeline over HTTP: the same scorer and selector, the remote target.
    over_http = Pipeline(local.scorer, local.selector, remote).generate(messages, params)
    assert over_http.text == expected.text and over_http.usage.kept_tokens == compressed.kept
    # Streaming, sync and async, yields the same text.
    chunks = list(remote.stream(compressed, params))
    assert "".join(c.text for c in chunks) == expected.text
    assert chunks[-1].completion is not None and chunks[-1].completion.token_ids == expected.token_ids

    async def both() -> tuple[str, str]:
        whole = await remote.agenerate(compressed, params)
        parts = [c.text async for c in remote.astream(compressed, params)]
        await remote.aclose()
        return whole.text, "".join(parts)

    assert asyncio.run(both()) == (expected.text, expected.text)


@pytest.mark.slow
def test_text_mode_sends_a_shorter_chat_to_any_endpoint(
    server: ServerProcess, local: Any, messages: list[dict[str, str]]
) -> None:
    from specprefill_sdk.pipeline import Pipeline

    remote = OpenAIBackend(server.api, model=MODEL, tokenizer=local.backend.tokenizer, mode="text", api_key=KEY)
    assert not remote.capabilities.supports_position_ids
    compressed = local.compress(messages)
    sent = render_kept_messages(compressed, remote.tokenizer, remote.separator)
    remote_ids = httpx.post(
        f"{server.api}/tokenize", json={"messages": sent}, headers={"Authorization": f"Bearer {KEY}"}
    ).json()["tokens"]
    assert len(remote_ids) < 0.5 * compressed.n
    answer = Pipeline(local.scorer, local.selector, remote).generate(messages, max_tokens=6)
    assert answer.text and answer.usage.prompt_tokens == compressed.n
    assert answer.usage.kept_tokens == compressed.kept and answer.selection is not None
    streamed = list(Pipeline(local.scorer, local.selector, remote).stream(messages, max_tokens=6))
    assert "".join(c.text for c in streamed) == answer.text


@pytest.mark.slow
def test_remote_errors_become_typed_errors(server: ServerProcess, tok: Any) -> None:
    remote = OpenAIBackend(server.api, model=MODEL, tokenizer=tok, mode="positions", api_key=KEY, max_retries=0)
    params = SamplingParams(max_tokens=4)
    with pytest.raises(InvalidRequestError, match="vocabulary"):
        remote.generate(CompressedPrompt((1, 60000), (0, 1), 2), params)
    with pytest.raises(ContextTooLongError):
        remote.generate(CompressedPrompt((1, 2), (0, 8190), 8191), params)
    other = OpenAIBackend(server.api, model="gpt-4o", tokenizer=tok, mode="positions", api_key=KEY, max_retries=0)
    with pytest.raises(NotFoundError):
        other.generate(CompressedPrompt((1, 2), (0, 1), 2), params)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "specprefill": {"policy": "x"}}
    answer = httpx.post(f"{server.api}/chat/completions", json=body, headers={"Authorization": f"Bearer {KEY}"})
    from specprefill_sdk.backends.openai import _remote_error

    assert isinstance(_remote_error(answer), PolicyError)
