"""The OpenAI-compatible server as a real process on 127.0.0.1, driven by the official `openai` client.

One server process serves the whole module (API key set, one worker, a queue of 4).
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from typing import Any

import httpx
import openai
import pytest
from server_utils import ServerProcess, start_server

pytestmark = pytest.mark.slow

KEY = "test-key-123"
MODEL = "smollm2-135m"
AUTH = {"Authorization": f"Bearer {KEY}"}
MAX_PROMPT_TOKENS = 1500
MAX_OUTPUT_TOKENS = 48


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    log = tmp_path_factory.mktemp("server") / "server.log"
    proc = start_server(
        [
            "--model",
            MODEL,
            "--device",
            "cpu",
            "--policy",
            "paper",  # the tests below check the paper method's selections; auto is the default
            "--api-key",
            KEY,
            "--max-concurrency",
            "1",
            "--max-queue",
            "4",
            "--max-prompt-tokens",
            str(MAX_PROMPT_TOKENS),
            "--max-output-tokens",
            str(MAX_OUTPUT_TOKENS),
            "--warmup-tokens",
            "256",
        ],
        log,
    )
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.api, api_key=KEY, max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def text() -> str:
    from specprefill_sdk.eval.corpora import haystack

    return haystack(1200)


def _messages(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text + "\n\nIn one sentence, what is this text about?"}]


def _sp(resp: Any) -> dict[str, Any]:
    return dict(resp.model_dump()["usage"]["specprefill"])


# ----------------------------------------------------------------------------- the openai client
def test_the_server_warmed_up_before_it_answered(server: ServerProcess) -> None:
    warmup = httpx.get(f"{server.base}/health", timeout=30).json()["warmup"]
    assert warmup is not None and 200 <= warmup["prompt_tokens"] <= 256
    assert 0 < warmup["kept_tokens"] < warmup["prompt_tokens"] and warmup["seconds"] > 0


def test_serve_refuses_a_negative_warm_up() -> None:
    import argparse

    from specprefill_sdk.cli.serve import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert parser.parse_args([]).warmup_tokens is None
    assert parser.parse_args(["--warmup-tokens", "0"]).warmup_tokens == 0
    with pytest.raises(SystemExit):
        parser.parse_args(["--warmup-tokens", "-5"])


def test_models_advertise_the_specprefill_capability(client: openai.OpenAI, server: ServerProcess) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    raw = httpx.get(f"{server.api}/models", headers=AUTH).json()
    capability = raw["data"][0]["specprefill"]
    assert capability["position_ids"] is True
    assert "paper" in capability["policies"] and capability["default_policy"] == "paper"  # as --policy asked
    assert "auto" in capability["policies"] and "adaptive" not in capability["policies"]
    assert capability["max_context"] == 8192 and capability["vocab_size"] == 49152
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4o")


def test_chat_completion_compresses_and_reports_usage(client: openai.OpenAI, server: ServerProcess, text: str) -> None:
    ids = httpx.post(f"{server.api}/tokenize", json={"messages": _messages(text)}, headers=AUTH).json()["tokens"]
    resp = client.chat.completions.create(model=MODEL, messages=_messages(text), max_tokens=6)  # type: ignore[arg-type]
    assert resp.object == "chat.completion"
    assert resp.choices[0].message.role == "assistant" and resp.choices[0].message.content
    assert resp.choices[0].finish_reason in ("stop", "length")
    assert resp.usage is not None and resp.usage.prompt_tokens == len(ids)
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens
    sp = _sp(resp)
    # The paper policy keeps 10% in chunks of 32, plus the sink and the generation prompt.
    assert 0 < sp["kept_tokens"] < 0.3 * len(ids)
    assert sp["keep_ratio"] == pytest.approx(sp["kept_tokens"] / len(ids))
    assert sp["score_ms"] > 0 and sp["prefill_ms"] > 0 and sp["fallback"] is None
    assert "keep-rate 0.1" in sp["reason"]  # a prompt above the dense threshold is compressed


def test_a_short_chat_is_prefilled_whole_by_the_paper_policy(client: openai.OpenAI) -> None:
    from specprefill_sdk.policies import DEFAULT_DENSE_BELOW_TOKENS

    messages = [
        {"role": "system", "content": "You are a helpful assistant. Answer in one short sentence."},
        {"role": "user", "content": "What is the capital of France, and which river runs through it?"},
    ]
    resp = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4)  # type: ignore[arg-type]
    assert resp.usage is not None and 32 < resp.usage.prompt_tokens < DEFAULT_DENSE_BELOW_TOKENS
    sp = _sp(resp)
    assert sp["kept_tokens"] == resp.usage.prompt_tokens and sp["score_ms"] == 0  # the draft never ran
    assert sp["reason"] == f"dense below {DEFAULT_DENSE_BELOW_TOKENS} tokens" and sp["fallback"] is None
    # asked for explicitly, the same chat is compressed
    resp = client.chat.completions.create(
        model=MODEL,
        messages=messages,  # type: ignore[arg-type]
        max_tokens=4,
        extra_body={"specprefill": {"min_prompt_tokens": 0}},
    )
    assert resp.usage is not None and _sp(resp)["kept_tokens"] < resp.usage.prompt_tokens


def test_extra_body_controls_compression(client: openai.OpenAI, text: str) -> None:
    def create(options: dict[str, Any]) -> dict[str, Any]:
        resp = client.chat.completions.create(
            model=MODEL,
            messages=_messages(text),
            max_tokens=2,  # type: ignore[arg-type]
            extra_body={"specprefill": options},
        )
        return _sp(resp) | {"n": resp.usage.prompt_tokens if resp.usage else 0}

    half = create({"keep_rate": 0.5, "chunk_size": 8, "look_ahead": 2})
    assert 0.5 <= half["keep_ratio"] < 0.75
    early = create({"keep_rate": 0.3, "look_ahead": 1, "layers": 10})
    assert 0.3 <= early["keep_ratio"] < 0.5 and early["score_ms"] > 0
    off = create({"enabled": False})
    assert off["kept_tokens"] == off["n"] and off["score_ms"] == 0
    dense = create({"policy": "dense"})
    assert dense["kept_tokens"] == dense["n"]
    budget = create({"token_budget": 40, "chunk_size": 1})
    assert budget["kept_tokens"] == 40


def test_completions_take_text_or_token_ids(client: openai.OpenAI, server: ServerProcess) -> None:
    prompt = "The capital of France is Paris. The capital of Italy is"
    ids = httpx.post(f"{server.api}/tokenize", json={"prompt": prompt}, headers=AUTH).json()["tokens"]
    by_text = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=3, extra_body={"specprefill": {"enabled": False}}
    )
    by_ids = client.completions.create(
        model=MODEL, prompt=ids, max_tokens=3, extra_body={"specprefill": {"enabled": False, "return_token_ids": True}}
    )
    assert by_text.object == "text_completion"
    assert by_text.choices[0].text == by_ids.choices[0].text and by_text.choices[0].text.strip()
    assert by_ids.usage is not None and by_ids.usage.prompt_tokens == len(ids)
    assert len(by_ids.model_dump()["choices"][0]["token_ids"]) == by_ids.usage.completion_tokens


def test_streaming_matches_the_whole_answer_and_ends_with_usage(client: openai.OpenAI, text: str) -> None:
    kwargs: dict[str, Any] = {
        "model": MODEL,
        "messages": _messages(text),
        "max_tokens": 8,
        "extra_body": {"specprefill": {"keep_rate": 0.3}},
    }
    whole = client.chat.completions.create(**kwargs)
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs))
    assert chunks[0].choices[0].delta.role == "assistant"
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason]
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert last.usage.prompt_tokens == whole.usage.prompt_tokens  # type: ignore[union-attr]
    assert last.model_dump()["usage"]["specprefill"]["kept_tokens"] == _sp(whole)["kept_tokens"]


def test_usage_breaks_the_time_to_first_token_down(client: openai.OpenAI, text: str) -> None:
    kwargs: dict[str, Any] = {"model": MODEL, "prompt": _messages(text)[0]["content"], "max_tokens": 3}
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs))
    streamed = chunks[-1].model_dump()["usage"]["specprefill"]
    whole = _sp(client.completions.create(**kwargs))
    for sp in (streamed, whole):
        assert sp["score_ms"] > 0 and sp["tokenize_ms"] > 0 and sp["select_ms"] > 0 and sp["ttft_ms"] > 0
        assert sp["submit_ms"] is None  # the transformers engine hands no request to another engine
        assert sp["queue_ms"] is None or sp["queue_ms"] <= sp["score_ms"]
        assert sp["host_ms"] == pytest.approx(sp["server_ms"] - sp["score_ms"] - sp["prefill_ms"])
        # the stages run one after the other inside the server's time to the first token
        assert 0 < sp["admit_ms"] < sp["server_ms"] - sp["tokenize_ms"] - sp["score_ms"] - sp["prefill_ms"]
        assert sp["server_ms"] > sp["tokenize_ms"] + sp["score_ms"] + sp["select_ms"] + sp["prefill_ms"]


def test_stream_without_include_usage_has_no_usage_chunk(client: openai.OpenAI) -> None:
    chunks = list(
        client.completions.create(
            model=MODEL,
            prompt="Once upon a time",
            max_tokens=3,
            stream=True,
            extra_body={"specprefill": {"enabled": False}},
        )
    )
    assert chunks and all(c.choices for c in chunks)
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")


def test_tokenize_applies_the_chat_template(server: ServerProcess) -> None:
    from transformers import AutoTokenizer

    from specprefill_sdk.models import resolve_model_path
    from specprefill_sdk.prompt import build_prompt

    tokenizer = AutoTokenizer.from_pretrained(str(resolve_model_path(MODEL, progress=False)))
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]
    got = httpx.post(f"{server.api}/tokenize", json={"messages": messages}, headers=AUTH).json()
    assert got["tokens"] == list(build_prompt(tokenizer, messages).token_ids)
    assert got["count"] == len(got["tokens"]) and got["max_model_len"] == 8192
    assert tokenizer.decode(got["tokens"]).endswith("<|im_start|>assistant\n")


def test_api_key_is_required_on_v1_routes(server: ServerProcess) -> None:
    assert httpx.get(f"{server.base}/health").status_code == 200
    bad = openai.OpenAI(base_url=server.api, api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    missing = httpx.get(f"{server.api}/models")
    assert missing.status_code == 401 and missing.headers["www-authenticate"] == "Bearer"
    assert missing.json()["error"]["code"] == "invalid_api_key"


# ----------------------------------------------------------------------------- bad inputs
def _chat(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, **extra}


def _sp_body(**options: Any) -> dict[str, Any]:
    return _chat(specprefill=options)


def _pre(ids: list[int], positions: list[int], **more: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "max_tokens": 2,
        "specprefill": {"prompt_token_ids": ids, "position_ids": positions, **more},
    }


CHAT, COMP, TOK = "/v1/chat/completions", "/v1/completions", "/v1/tokenize"
BAD_INPUTS: list[tuple[str, str, str, Any, dict[str, str] | None, int]] = [
    # (case, method, path, body (dict: JSON, bytes: raw, callable: streamed chunks), headers (None: the key), status)
    ("malformed JSON", "POST", CHAT, b'{"model": "x", "messages": [', None, 400),
    ("empty body", "POST", CHAT, b"", None, 400),
    ("non-UTF-8 bytes", "POST", CHAT, b'{"messages": [{"role": "user", "content": "\xff\xfe\xfa"}]}', None, 400),
    ("JSON array instead of object", "POST", CHAT, b"[1, 2, 3]", None, 400),
    ("no messages", "POST", CHAT, {"model": MODEL, "max_tokens": 2}, None, 400),
    ("empty messages", "POST", CHAT, _chat(messages=[]), None, 400),
    ("messages is a string", "POST", CHAT, _chat(messages="hello"), None, 400),
    ("message without role", "POST", CHAT, _chat(messages=[{"content": "Hi"}]), None, 400),
    ("content is a number", "POST", CHAT, _chat(messages=[{"role": "user", "content": 42}]), None, 400),
    (
        "image content part",
        "POST",
        CHAT,
        _chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]),
        None,
        400,
    ),
    ("every message empty", "POST", CHAT, _chat(messages=[{"role": "user", "content": "  "}]), None, 400),
    ("max_tokens zero", "POST", CHAT, _chat(max_tokens=0), None, 400),
    ("max_tokens a string", "POST", CHAT, _chat(max_tokens="ten"), None, 400),
    ("max_tokens above the server's limit", "POST", CHAT, _chat(max_tokens=MAX_OUTPUT_TOKENS + 1), None, 400),
    ("negative temperature", "POST", CHAT, _chat(temperature=-1), None, 400),
    ("top_p zero", "POST", CHAT, _chat(top_p=0), None, 400),
    ("n above one", "POST", CHAT, _chat(n=2), None, 400),
    ("five stop strings", "POST", CHAT, _chat(stop=["a", "b", "c", "d", "e"]), None, 400),
    ("top_logprobs without logprobs", "POST", CHAT, _chat(top_logprobs=2), None, 400),
    ("top_logprobs above twenty", "POST", CHAT, _chat(logprobs=True, top_logprobs=21), None, 400),
    ("keep rate zero", "POST", CHAT, _sp_body(keep_rate=0), None, 400),
    ("keep rate above one", "POST", CHAT, _sp_body(keep_rate=1.5), None, 400),
    ("keep rate a word", "POST", CHAT, _sp_body(keep_rate="high"), None, 400),
    ("unknown specprefill field", "POST", CHAT, _sp_body(keep_ratio=0.2), None, 400),
    ("specprefill not an object", "POST", CHAT, _chat(specprefill="fast"), None, 400),
    ("unknown policy", "POST", CHAT, _sp_body(policy="turbo"), None, 400),
    ("policy given as a path", "POST", CHAT, _sp_body(policy="../../etc/passwd"), None, 400),
    ("look-ahead zero", "POST", CHAT, _sp_body(look_ahead=0), None, 400),
    ("draft layers zero", "POST", CHAT, _sp_body(look_ahead=1, layers=0), None, 400),
    ("draft layers with look-ahead 8", "POST", CHAT, _sp_body(layers=10), None, 400),
    ("more draft layers than the draft has", "POST", CHAT, _sp_body(look_ahead=1, layers=31), None, 400),
    ("negative chunk size", "POST", CHAT, _sp_body(chunk_size=-3), None, 400),
    ("negative min_prompt_tokens", "POST", CHAT, _sp_body(min_prompt_tokens=-1), None, 400),
    ("keep rate and token budget", "POST", CHAT, _sp_body(keep_rate=0.2, token_budget=10), None, 400),
    ("unknown conversation id", "POST", CHAT, _sp_body(conversation_id="c-1"), None, 404),
    ("ids without positions", "POST", COMP, {"specprefill": {"prompt_token_ids": [1, 2]}}, None, 400),
    ("ids and positions differ in length", "POST", COMP, _pre([1, 2, 3], [0, 5]), None, 400),
    ("positions not increasing", "POST", COMP, _pre([1, 2, 3], [0, 7, 7]), None, 400),
    ("positions decreasing", "POST", COMP, _pre([1, 2, 3], [9, 4, 1]), None, 400),
    ("negative position", "POST", COMP, _pre([1, 2], [-1, 3]), None, 400),
    ("position beyond the context", "POST", COMP, _pre([1, 2], [0, 9000]), None, 400),
    ("prompt_length before the last position", "POST", COMP, _pre([1, 2], [0, 9], prompt_length=5), None, 400),
    ("id outside the vocabulary", "POST", COMP, _pre([1, 49152], [0, 1]), None, 400),
    ("negative id", "POST", COMP, _pre([-5, 2], [0, 1]), None, 400),
    ("prompt ids outside the vocabulary", "POST", COMP, {"prompt": [1, 10**9], "max_tokens": 2}, None, 400),
    ("two prompts", "POST", COMP, {"prompt": ["a", "b"], "max_tokens": 2}, None, 400),
    ("empty id prompt", "POST", COMP, {"prompt": [], "max_tokens": 2}, None, 400),
    (
        "prompt and pre-compressed ids",
        "POST",
        COMP,
        {"prompt": "Hi", "specprefill": {"prompt_token_ids": [1], "position_ids": [0]}},
        None,
        400,
    ),
    ("prompt is an object", "POST", COMP, {"prompt": {"text": "Hi"}}, None, 400),
    ("huge body", "POST", CHAT, b"{" + b" " * (5 * 1024 * 1024) + b"}", None, 413),
    (
        "huge chunked body (no Content-Length)",
        "POST",
        COMP,
        lambda: iter([b'{"prompt": "'] + [b"x" * 65536] * 80),
        None,
        413,
    ),
    ("prompt over --max-prompt-tokens", "POST", COMP, {"prompt": "word " * (MAX_PROMPT_TOKENS + 50)}, None, 413),
    ("unknown model", "POST", CHAT, _chat(model="gpt-4o"), None, 404),
    ("unknown route", "POST", "/v1/embeddings", {"input": "x"}, None, 404),
    ("wrong method", "GET", CHAT, None, None, 405),
    (
        "tokenize with messages and prompt",
        "POST",
        TOK,
        {"prompt": "a", "messages": [{"role": "user", "content": "b"}]},
        None,
        400,
    ),
    ("missing API key", "POST", CHAT, _chat(), {}, 401),
    ("wrong API key", "POST", CHAT, _chat(), {"Authorization": "Bearer nope"}, 401),
    ("wrong auth scheme", "POST", CHAT, _chat(), {"Authorization": f"Basic {KEY}"}, 401),
]


def test_bad_input_corpus_is_large_enough() -> None:
    assert len(BAD_INPUTS) >= 30
    assert len({case[0] for case in BAD_INPUTS}) == len(BAD_INPUTS)


@pytest.mark.parametrize(
    ("case", "method", "path", "body", "headers", "status"), BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS]
)
def test_bad_input_gets_the_documented_4xx(
    server: ServerProcess, case: str, method: str, path: str, body: Any, headers: dict[str, str] | None, status: int
) -> None:
    sent_headers = dict(AUTH if headers is None else headers)
    kwargs: dict[str, Any] = {"headers": sent_headers, "timeout": 120}
    if isinstance(body, bytes) or callable(body):
        kwargs["content"] = body() if callable(body) else body
        sent_headers["Content-Type"] = "application/json"
    elif body is not None:
        kwargs["json"] = body
    response = httpx.request(method, server.base + path, **kwargs)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"] and isinstance(error["type"], str)
    assert server.alive()


def test_a_schema_violation_is_a_400_that_names_the_field(client: openai.OpenAI) -> None:
    # OpenAI and vLLM answer 400 here, which the openai client raises as BadRequestError (422 would not be).
    cases: list[tuple[dict[str, Any], str]] = [
        ({"max_tokens": 0}, "max_tokens"),
        ({"messages": [{"role": "user", "content": 42}]}, "messages.0.content"),
        ({"extra_body": {"specprefill": {"keep_rate": 1.5}}}, "specprefill.keep_rate"),
    ]
    for change, param in cases:
        kwargs: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(**(kwargs | change))
        assert info.value.status_code == 400
        assert info.value.param == param and info.value.code == "invalid_value", info.value.body
        assert info.value.type == "invalid_request_error"


# ----------------------------------------------------------------------------- serving discipline
def test_sixteen_concurrent_clients_get_answers_or_429(server: ServerProcess) -> None:
    statuses: Counter[int] = Counter()
    retry_after: list[str] = []
    lock = threading.Lock()

    def client_loop(start: threading.Barrier) -> None:
        with httpx.Client(base_url=server.base, headers=AUTH, timeout=300) as http:
            start.wait()  # all at once: 16 clients against 1 worker and 4 queue places
            for _ in range(3):
                r = http.post(
                    "/v1/completions",
                    json={"prompt": "Count: one, two,", "max_tokens": 2, "specprefill": {"enabled": False}},
                )
                with lock:
                    statuses[r.status_code] += 1
                    if r.status_code == 429:
                        retry_after.append(r.headers.get("retry-after", ""))
                        assert r.json()["error"]["type"] == "rate_limit_error"

    # A round whose requests happen not to overlap refuses none; a 429 is required, so at most
    # three rounds are sent.
    rounds = 0
    while rounds < 3 and not statuses[429]:
        rounds += 1
        start = threading.Barrier(16, timeout=60)
        threads = [threading.Thread(target=client_loop, args=(start,)) for _ in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    print(f"16 clients x 3 requests x {rounds} rounds: {dict(statuses)}")
    assert set(statuses) <= {200, 429}
    assert statuses[429] >= 1 and statuses[200] >= 5 and sum(statuses.values()) == 48 * rounds
    assert all(v.isdigit() and int(v) >= 1 for v in retry_after)
    health = httpx.get(f"{server.base}/health").json()
    assert server.alive() and health["in_flight"] == 0 and health["queue_depth"] == 0


def test_client_disconnect_mid_stream_frees_the_server(server: ServerProcess) -> None:
    body = {
        "model": MODEL,
        "prompt": "Once upon a time, in a land of mountains and rivers, there lived a dragon who",
        "max_tokens": MAX_OUTPUT_TOKENS,
        "stream": True,
        "specprefill": {"enabled": False},
    }
    seen = 0
    cancelled = httpx.get(f"{server.base}/health").json()["cancelled_streams"]
    with (
        httpx.Client(headers=AUTH, timeout=300) as http,
        http.stream("POST", f"{server.api}/completions", json=body) as response,
    ):
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: {"):
                seen += 1
                if seen == 2:
                    assert httpx.get(f"{server.base}/health").json()["in_flight"] == 1
                    break
    # The connection is closed here, mid-stream: the server must stop generating and free its slot.
    deadline = time.monotonic() + 120
    in_flight = None
    while time.monotonic() < deadline:
        in_flight = httpx.get(f"{server.base}/health").json()["in_flight"]
        if in_flight == 0:
            break
        time.sleep(0.1)
    assert in_flight == 0
    # The generation was stopped before its end, not run to completion for nobody.
    assert httpx.get(f"{server.base}/health").json()["cancelled_streams"] == cancelled + 1
    after = httpx.post(
        f"{server.api}/completions",
        headers=AUTH,
        timeout=300,
        json={"prompt": "Hello", "max_tokens": 2, "specprefill": {"enabled": False}},
    )
    assert after.status_code == 200 and after.json()["usage"]["completion_tokens"] >= 1
    assert "a stream failed" not in server.log()


def test_openapi_document_describes_the_extension(server: ServerProcess) -> None:
    doc = httpx.get(f"{server.base}/openapi.json").json()
    assert {"/v1/chat/completions", "/v1/completions", "/v1/tokenize", "/v1/models", "/health"} <= set(doc["paths"])
    options = doc["components"]["schemas"]["SpecPrefillOptions"]["properties"]
    assert {
        "enabled",
        "policy",
        "keep_rate",
        "chunk_size",
        "look_ahead",
        "min_prompt_tokens",
        "prompt_token_ids",
        "position_ids",
    } <= set(options)
    assert "429" in doc["paths"]["/v1/chat/completions"]["post"]["responses"]
    # schema violations are answered with 400, and the document says so
    assert not any("422" in op["responses"] for ops in doc["paths"].values() for op in ops.values())
    assert "HTTPValidationError" not in doc["components"]["schemas"]
    assert json.dumps(doc["components"]["securitySchemes"]).count("bearer") >= 1


def test_the_server_client_example_runs(server: ServerProcess) -> None:
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "examples" / "server_client.py"
    done = subprocess.run(
        [
            sys.executable,
            str(script),
            "--base-url",
            server.api,
            "--api-key",
            KEY,
            "--chars",
            "1200",
            "--max-tokens",
            "4",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "[chat] prompt" in done.stdout and "[stream] kept" in done.stdout
    assert "[pipeline, positions mode]" in done.stdout
