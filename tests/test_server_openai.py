"""The OpenAI surface clients rely on, against apps built here and served by uvicorn on 127.0.0.1:
defaults, fields that are refused rather than ignored, vLLM's extensions and routes, request ids,
keep-alive comments, and every response shape parsed by the `openai` package's own types.

The apps share the session's loaded SmolLM2 (no second copy of the weights).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from server_utils import serve_in_thread

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m"


@pytest.fixture(scope="module")
def url(backend: Any) -> Iterator[str]:
    from specprefill_sdk.server import ServerConfig, create_app

    with serve_in_thread(create_app(ServerConfig(policy="paper", max_output_tokens=8), backend=backend)) as base:
        yield base


@pytest.fixture(scope="module")
def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=300)


# ----------------------------------------------------------------------------- max_tokens
def test_max_tokens_defaults_to_what_the_context_leaves(backend: Any) -> None:
    from specprefill_sdk.server import ServerConfig
    from specprefill_sdk.server.engine import ServingEngine
    from specprefill_sdk.server.schemas import SpecPrefillOptions

    dense = SpecPrefillOptions(enabled=False)
    context = backend.max_context

    def resolved(config: ServerConfig, prompt: Any = "Hello there", max_tokens: int | None = None) -> int:
        engine = ServingEngine(backend, None, config=config)
        try:
            prepared = engine.prepare(prompt, dense, {"max_tokens": max_tokens})
            return int(prepared.params.max_tokens)
        finally:
            engine.shutdown()

    n = len(backend.tokenizer("Hello there")["input_ids"])
    assert resolved(ServerConfig(policy="dense")) == context - n  # the whole context, as vLLM gives
    assert resolved(ServerConfig(policy="dense", max_output_tokens=300)) == 300
    assert resolved(ServerConfig(policy="dense", default_max_tokens=40)) == 40
    assert resolved(ServerConfig(policy="dense", default_max_tokens=40, max_output_tokens=30)) == 30
    assert resolved(ServerConfig(policy="dense"), max_tokens=7) == 7  # a client's own value stays
    long_prompt = "word " * (context - 20)
    n_long = len(backend.tokenizer(long_prompt)["input_ids"])
    assert resolved(ServerConfig(policy="dense", default_max_tokens=4000), long_prompt) == context - n_long


# ----------------------------------------------------------------------------- fields refused, not ignored
HI = [{"role": "user", "content": "Hi"}]
REFUSED_CHAT: dict[str, dict[str, Any]] = {
    "n": {"n": 2},
    "response_format": {"response_format": {"type": "json_object"}},
    "response_format json_schema": {
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}
    },
    "logit_bias": {"logit_bias": {"42": 5}},
    "functions": {"functions": [{"name": "f", "parameters": {"type": "object"}}]},
    "function_call": {"function_call": {"name": "f"}},
    "tool_choice": {"tool_choice": "required"},
    "tool_choice named": {"tool_choice": {"type": "function", "function": {"name": "f"}}},
    "parallel_tool_calls": {"parallel_tool_calls": False},
    "presence_penalty": {"presence_penalty": 0.5},
    "frequency_penalty": {"frequency_penalty": -1.0},
    "repetition_penalty": {"extra_body": {"repetition_penalty": 1.2}},
}
REFUSED_COMPLETION: dict[str, dict[str, Any]] = {
    "echo": {"echo": True},
    "best_of": {"best_of": 2},
    "suffix": {"suffix": "the end"},
    "n": {"n": 3},
    "logit_bias": {"logit_bias": {"42": -100}},
}


@pytest.mark.parametrize("case", sorted(REFUSED_CHAT))
def test_a_chat_field_the_server_cannot_honour_is_a_400_naming_it(client: openai.OpenAI, case: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=HI, max_tokens=1, **REFUSED_CHAT[case])  # type: ignore[call-overload]
    assert info.value.param == case.split()[0] and info.value.code == "unsupported_parameter", info.value.body
    assert "not served" in info.value.message


@pytest.mark.parametrize("case", sorted(REFUSED_COMPLETION))
def test_a_completion_field_the_server_cannot_honour_is_a_400_naming_it(client: openai.OpenAI, case: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL, prompt="Hi", max_tokens=1, **REFUSED_COMPLETION[case])
    assert info.value.param == case and info.value.code == "unsupported_parameter", info.value.body


def test_the_values_that_ask_for_nothing_are_served(client: openai.OpenAI) -> None:
    answer = client.chat.completions.create(
        model=MODEL,
        messages=HI,  # type: ignore[arg-type]
        max_tokens=1,
        n=1,
        response_format={"type": "text"},
        logit_bias={},
        tool_choice="none",
        logprobs=False,
        presence_penalty=0,
        frequency_penalty=0.0,
        extra_body={"specprefill": {"enabled": False}, "repetition_penalty": 1.0},
    )
    assert answer.choices[0].finish_reason in ("stop", "length")


# ----------------------------------------------------------------------------- tools, logprobs
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


def test_tools_on_a_model_whose_template_has_no_tool_support_are_a_400(client: openai.OpenAI) -> None:
    # SmolLM2's template writes role and content only: tools would never reach the model.
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=HI, max_tokens=1, tools=[TOOL])  # type: ignore[list-item]
    assert info.value.param == "tools" and info.value.code == "tools_unsupported", info.value.body
    assert "chat template does not render tools" in info.value.message
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    history = [*HI, {"role": "assistant", "content": None, "tool_calls": [call]}, {"role": "user", "content": "And?"}]
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=history, max_tokens=1)  # type: ignore[arg-type]
    assert info.value.param == "messages" and info.value.code == "tools_unsupported", info.value.body


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/chat/completions", {"messages": HI, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ("/v1/chat/completions", {"messages": HI, "logprobs": True, "top_logprobs": -1}, "top_logprobs"),
        ("/v1/chat/completions", {"messages": HI, "top_logprobs": 2}, "top_logprobs"),
        ("/v1/chat/completions", {"messages": HI, "logprobs": False, "top_logprobs": 0}, "top_logprobs"),
        ("/v1/chat/completions", {"messages": HI, "logprobs": 1}, "logprobs"),
        ("/v1/completions", {"prompt": "Hi", "logprobs": 21}, "logprobs"),
        ("/v1/completions", {"prompt": "Hi", "logprobs": True}, "logprobs"),
        ("/v1/chat/completions", {"messages": HI, "tools": [{"type": "function", "function": {"name": "a b"}}]}, None),
        ("/v1/chat/completions", {"messages": HI, "tools": [{"type": "code", "function": {"name": "f"}}]}, None),
        (
            "/v1/chat/completions",
            {"messages": HI, "tools": [TOOL], "specprefill": {"conversation_start": True}},
            "tools",
        ),
    ],
)
def test_logprobs_and_tools_out_of_bounds_are_a_400(url: str, path: str, body: dict[str, Any], param: Any) -> None:
    answer = httpx.post(f"{url}{path}", json={**body, "max_tokens": 1}, timeout=60)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["type"] == "invalid_request_error"
    if param is not None:
        assert error["param"] == param, error
    else:
        assert str(error["param"]).startswith("tools"), error


def test_logprobs_of_chat_and_completions(client: openai.OpenAI) -> None:
    chat = client.chat.completions.create(
        model=MODEL,
        messages=HI,
        max_tokens=4,
        logprobs=True,
        top_logprobs=3,
        extra_body={"specprefill": {"enabled": False}},
    )
    content = chat.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) == chat.usage.completion_tokens  # type: ignore[union-attr]
    for item in content:
        assert len(item.top_logprobs) == 3 and item.logprob <= 0
        # greedy: the chosen token is the most likely one
        assert item.top_logprobs[0].token == item.token and item.top_logprobs[0].logprob == item.logprob
        assert [t.logprob for t in item.top_logprobs] == sorted((t.logprob for t in item.top_logprobs), reverse=True)
    text = "".join(item.token for item in content)
    assert chat.choices[0].message.content is not None and text.startswith(chat.choices[0].message.content)
    plain = client.chat.completions.create(model=MODEL, messages=HI, max_tokens=4, logprobs=True)
    assert all(item.top_logprobs == [] for item in plain.choices[0].logprobs.content or [])  # type: ignore[union-attr]
    completion = client.completions.create(model=MODEL, prompt="Colours: red, green,", max_tokens=4, logprobs=2)
    logprobs = completion.choices[0].logprobs
    assert logprobs is not None and logprobs.tokens and logprobs.top_logprobs and logprobs.text_offset
    assert "".join(logprobs.tokens) == completion.choices[0].text
    assert logprobs.text_offset == [sum(len(t) for t in logprobs.tokens[:i]) for i in range(len(logprobs.tokens))]
    for token, value, top in zip(logprobs.tokens, logprobs.token_logprobs or [], logprobs.top_logprobs, strict=True):
        assert top[token] == value and len(top) <= 3  # the 2 most likely, and the chosen one
    streamed = client.completions.create(
        model=MODEL, prompt="Colours: red, green,", max_tokens=4, logprobs=2, stream=True
    )
    parts = [c.choices[0].logprobs for c in streamed if c.choices and c.choices[0].logprobs is not None]
    assert [t for p in parts for t in p.tokens or []] == logprobs.tokens
    assert [o for p in parts for o in p.text_offset or []] == logprobs.text_offset
    assert [v for p in parts for v in p.token_logprobs or []] == pytest.approx(logprobs.token_logprobs)


def _at_eos(backend: Any) -> list[int]:
    """Token ids of a chat whose answer is complete but for its end token: greedy decoding stops at once."""
    from specprefill_sdk.prompt import build_prompt

    chat = [{"role": "user", "content": "Say hello."}, {"role": "assistant", "content": "Hello! How can I help you?"}]
    ids = list(build_prompt(backend.tokenizer, chat, add_generation_prompt=False).token_ids)
    end = max(i for i, t in enumerate(ids) if t == backend.tokenizer.convert_tokens_to_ids("<|im_end|>"))
    return ids[:end]


def test_ignore_eos_generates_past_the_end_of_sequence(client: openai.OpenAI, backend: Any) -> None:
    # vLLM's extension, which `vllm bench serve` sends for answers of a fixed length
    prompt = _at_eos(backend)
    dense = {"specprefill": {"enabled": False}}
    stops = client.completions.create(model=MODEL, prompt=prompt, max_tokens=3, extra_body=dense)
    assert stops.choices[0].finish_reason == "stop" and stops.usage is not None and stops.usage.completion_tokens < 3
    goes_on = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=3, extra_body={**dense, "ignore_eos": True}
    )
    assert goes_on.choices[0].finish_reason == "length"
    assert goes_on.usage is not None and goes_on.usage.completion_tokens == 3
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL, prompt=prompt, max_tokens=3, extra_body={"ignore_eos": "yes"})
    assert info.value.param == "ignore_eos"


# ----------------------------------------------------------------------------- vLLM's tokenize routes
def test_tokenize_and_detokenize_answer_at_vllms_paths_with_its_fields(url: str, backend: Any) -> None:
    text = "The lighthouse keeper wrote down the wind."
    chat = [{"role": "user", "content": text}]
    for path in ("/tokenize", "/v1/tokenize"):
        by_prompt = httpx.post(f"{url}{path}", json={"model": MODEL, "prompt": text}, timeout=60).json()
        assert by_prompt["tokens"] == backend.tokenizer(text)["input_ids"]
        assert by_prompt["count"] == len(by_prompt["tokens"]) and by_prompt["max_model_len"] == backend.max_context
        assert by_prompt["token_strs"] is None
        by_chat = httpx.post(f"{url}{path}", json={"model": MODEL, "messages": chat}, timeout=60).json()
        assert by_chat["count"] > by_prompt["count"]  # the template's tokens around the text
        strs = httpx.post(f"{url}{path}", json={"prompt": text, "return_token_strs": True}, timeout=60).json()
        assert strs["token_strs"] == backend.tokenizer.convert_ids_to_tokens(by_prompt["tokens"])
    for path in ("/detokenize", "/v1/detokenize"):
        back = httpx.post(f"{url}{path}", json={"model": MODEL, "tokens": by_chat["tokens"]}, timeout=60)
        assert back.status_code == 200 and back.json() == {"prompt": backend.tokenizer.decode(by_chat["tokens"])}
        assert text in back.json()["prompt"] and "<|im_start|>" in back.json()["prompt"]


TOKEN_ROUTE_ERRORS: dict[str, tuple[str, dict[str, Any], str, str]] = {
    "id outside the vocabulary": ("/detokenize", {"tokens": [1, 10**9]}, "tokens.1", "invalid_value"),
    "ids as strings": ("/detokenize", {"tokens": ["1"]}, "tokens.0", "invalid_value"),
    "no tokens": ("/detokenize", {"model": MODEL}, "tokens", "invalid_value"),
    "unknown model": ("/detokenize", {"model": "gpt-4o", "tokens": [1]}, "model", "model_not_found"),
    "special tokens added to a chat": (
        "/tokenize",
        {"messages": [{"role": "user", "content": "Hi"}], "add_special_tokens": True},
        "add_special_tokens",
        "unsupported_parameter",
    ),
    "another chat template": (
        "/tokenize",
        {"messages": [{"role": "user", "content": "Hi"}], "chat_template": "{{ messages }}"},
        "chat_template",
        "unsupported_parameter",
    ),
    "an open final message": (
        "/tokenize",
        {"messages": [{"role": "user", "content": "Hi"}], "continue_final_message": True},
        "continue_final_message",
        "unsupported_parameter",
    ),
}


@pytest.mark.parametrize("case", sorted(TOKEN_ROUTE_ERRORS))
def test_the_token_routes_refuse_what_they_cannot_do(url: str, case: str) -> None:
    path, body, param, code = TOKEN_ROUTE_ERRORS[case]
    response = httpx.post(f"{url}{path}", json=body, timeout=60)
    assert response.status_code in (400, 404), response.text
    assert response.json()["error"]["param"] == param and response.json()["error"]["code"] == code


def test_the_root_token_routes_need_the_api_key(backend: Any) -> None:
    from specprefill_sdk.server import ServerConfig, create_app

    with serve_in_thread(create_app(ServerConfig(policy="dense", api_keys=("k-1",)), backend=backend)) as base:
        for path, body in (("/tokenize", {"prompt": "Hi"}), ("/detokenize", {"tokens": [1, 2]})):
            assert httpx.post(f"{base}{path}", json=body, timeout=60).status_code == 401
            keyed = httpx.post(f"{base}{path}", json=body, headers={"Authorization": "Bearer k-1"}, timeout=60)
            assert keyed.status_code == 200, keyed.text


# ----------------------------------------------------------------------------- request ids
def test_the_clients_request_id_is_echoed_and_names_the_completion(client: openai.OpenAI) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=HI,  # type: ignore[arg-type]
        max_tokens=1,
        extra_headers={"X-Request-Id": "req-42.a:b"},
        extra_body={"specprefill": {"enabled": False}},
    )
    assert raw.headers["x-request-id"] == "req-42.a:b"
    assert raw.parse().id == "chatcmpl-req-42.a:b"
    stream = client.completions.create(
        model=MODEL,
        prompt="Hi",
        max_tokens=1,
        stream=True,
        extra_headers={"X-Request-Id": "stream-7"},
        extra_body={"specprefill": {"enabled": False}},
    )
    assert stream.response.headers["x-request-id"] == "stream-7"
    assert {chunk.id for chunk in stream} == {"cmpl-stream-7"}


def test_every_answer_carries_a_request_id_and_bad_ones_are_replaced(url: str, backend: Any) -> None:
    import re

    from specprefill_sdk.server import ServerConfig, create_app

    def rid(response: httpx.Response) -> str:
        return response.headers["x-request-id"]

    fresh = re.compile(r"^[0-9a-f]{32}$")
    ok = httpx.post(f"{url}/v1/tokenize", json={"prompt": "Hi"}, timeout=60)
    assert ok.status_code == 200 and fresh.match(rid(ok))
    assert rid(httpx.post(f"{url}/v1/tokenize", json={"prompt": "Hi"}, timeout=60)) != rid(ok)  # one per request
    for given in ("x" * 129, "has space", "tab\there", "caf\u00e9"):
        response = httpx.post(
            f"{url}/v1/tokenize", json={"prompt": "Hi"}, headers={"X-Request-Id": given.encode()}, timeout=60
        )
        assert fresh.match(rid(response)), given
    sent = {"X-Request-Id": "err-1"}
    assert rid(httpx.post(f"{url}/v1/chat/completions", json={"n": 2}, headers=sent, timeout=60)) == "err-1"  # 400
    assert rid(httpx.get(f"{url}/v1/nowhere", headers=sent, timeout=60)) == "err-1"  # 404
    too_big = httpx.post(f"{url}/v1/completions", content=b"{" + b" " * (5 << 20) + b"}", headers=sent, timeout=60)
    assert too_big.status_code == 413 and rid(too_big) == "err-1"  # refused before routing

    class FailingBackend(type(backend)):  # type: ignore[misc]
        """The real backend, whose generation fails as no SDK error (a bug), so the server answers 500."""

        def generate(self, prompt: Any, params: Any) -> Any:
            raise RuntimeError("boom")

    app = create_app(ServerConfig(policy="dense", api_keys=("k-1",)), backend=FailingBackend(backend.loaded))
    with serve_in_thread(app) as base:
        assert rid(httpx.get(f"{base}/v1/models", headers=sent, timeout=60)) == "err-1"  # 401
        failed = httpx.post(
            f"{base}/v1/completions",
            json={"prompt": "Hi", "max_tokens": 1},
            headers={**sent, "Authorization": "Bearer k-1"},
            timeout=60,
        )
        assert failed.status_code == 500 and rid(failed) == "err-1", failed.text


# ----------------------------------------------------------------------------- keep-alive
class SlowDraft:
    """A draft scorer that takes ``seconds`` per prompt, as a long prompt's scoring does."""

    name = "draft-attention"
    model_name = "slow-draft"

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def score(self, prompt: Any) -> Any:
        import time

        from specprefill_sdk.scoring import UniformScorer

        time.sleep(self.seconds)
        return UniformScorer().score(prompt)

    def score_batch(self, prompts: Any) -> list[Any]:
        return [self.score(p) for p in prompts]


@pytest.fixture(scope="module")
def slow_url(backend: Any) -> Iterator[str]:
    from specprefill_sdk.server import ServerConfig, create_app

    # Scoring takes ten keep-alive intervals: the stream waits that long for its first piece.
    config = ServerConfig(policy="paper", max_output_tokens=4, keepalive_interval=0.05)
    with serve_in_thread(create_app(config, backend=backend, scorer=SlowDraft(0.5))) as base:
        yield base


def _long_text() -> str:
    # long enough that the paper policy scores it (one under its dense threshold is kept whole, unscored)
    from specprefill_sdk.eval.corpora import haystack

    return haystack(1500)


def test_a_stream_that_waits_for_scoring_sends_keep_alive_comments(slow_url: str) -> None:
    text = _long_text()
    for path, body in (
        ("/v1/completions", {"prompt": text}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": text}]}),
    ):
        request = {"model": MODEL, "max_tokens": 2, "stream": True, "stream_options": {"include_usage": True}, **body}
        with httpx.stream("POST", f"{slow_url}{path}", json=request, timeout=120) as response:
            lines = [line for line in response.iter_lines() if line]
        assert response.status_code == 200
        first_data = next(
            i for i, line in enumerate(lines) if line.startswith("data: {") and '"content":""' not in line
        )
        assert ": keep-alive" in lines[:first_data], lines[:5]  # sent while the prompt was scored
        assert set(lines) - {": keep-alive"} == {line for line in lines if line.startswith("data: ")}
        assert lines[-1] == "data: [DONE]"
        usage = httpx.Response(200, content=lines[-2][6:]).json()["usage"]
        assert usage["specprefill"]["score_ms"] > 0 and usage["specprefill"]["fallback"] is None  # the draft ran


def test_the_openai_client_skips_keep_alive_comments(slow_url: str) -> None:
    client = openai.OpenAI(base_url=f"{slow_url}/v1", api_key="none", max_retries=0, timeout=120)
    messages = [{"role": "user", "content": _long_text()}]
    whole = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=3)  # type: ignore[arg-type]
    assert whole.model_dump()["usage"]["specprefill"]["score_ms"] > 0  # the slow draft ran
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=3, stream=True))  # type: ignore[arg-type]
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == whole.choices[0].message.content
    texts = list(client.completions.create(model=MODEL, prompt=_long_text(), max_tokens=3, stream=True))
    assert texts and texts[-1].choices[0].finish_reason in ("stop", "length")


def test_the_kept_positions_are_the_selection_the_pipeline_makes_streamed_or_not(url: str, backend: Any) -> None:
    from specprefill_sdk.policies import load_pipeline
    from specprefill_sdk.types import Prompt

    ids = backend.tokenizer(_long_text())["input_ids"]
    body = {"model": MODEL, "prompt": ids, "max_tokens": 2, "specprefill": {"return_kept_positions": True}}
    usage = httpx.post(f"{url}/v1/completions", json=body, timeout=120).json()["usage"]
    positions = usage["specprefill"]["kept_positions"]
    assert len(positions) == usage["specprefill"]["kept_tokens"] < usage["prompt_tokens"] == len(ids)
    # the reference: the library's pipeline with the server's policy and draft, on the same prompt
    pipe = load_pipeline("paper", model=MODEL, draft=MODEL, backend=backend, dense_when_slower=False)
    assert positions == list(pipe.compress(Prompt.from_token_ids(ids)).position_ids)
    stream = {**body, "stream": True, "stream_options": {"include_usage": True}}
    streamed = _sse_payloads(url, "/v1/completions", stream)
    assert streamed[-1]["usage"]["specprefill"]["kept_positions"] == positions
    # not asked for: null; dense (enabled false): every position
    plain = httpx.post(f"{url}/v1/completions", json={**body, "specprefill": {}}, timeout=120).json()["usage"]
    assert plain["specprefill"]["kept_positions"] is None
    dense = {"return_kept_positions": True, "enabled": False}
    whole = httpx.post(f"{url}/v1/completions", json={**body, "specprefill": dense}, timeout=120).json()["usage"]
    assert whole["specprefill"]["kept_positions"] == list(range(len(ids)))


@pytest.mark.parametrize(
    ("path", "extra", "param"),
    [
        ("/v1/completions", {"stream": True}, "specprefill.return_kept_positions"),
        ("/v1/chat/completions", {"stream": True, "stream_options": {"include_usage": False}}, None),
        ("/v1/completions", {"specprefill": {"prompt_token_ids": [5, 6], "position_ids": [0, 9]}}, None),
        ("/v1/chat/completions", {"specprefill": {"conversation_start": True}}, None),
    ],
)
def test_kept_positions_that_could_not_be_returned_are_a_400(
    url: str, path: str, extra: dict[str, Any], param: str | None
) -> None:
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 1, **extra}
    body["specprefill"] = {**body.get("specprefill", {}), "return_kept_positions": True}
    body["messages" if "chat" in path else "prompt"] = HI if "chat" in path else "Hello there"
    answer = httpx.post(f"{url}{path}", json=body, timeout=60)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["type"] == "invalid_request_error" and "return_kept_positions" in error["message"]
    if param is not None:
        assert error["param"] == param


# ----------------------------------------------------------------------------- the wire contract
#: The fields this server adds to OpenAI's shapes (documented in docs/server.md); any other extra is a defect.
EXTENSIONS = {"specprefill", "token_ids", "max_model_len", "kept_tokens", "keep_ratio", "score_ms", "prefill_ms"}
EXTENSIONS |= {"fallback", "reason", "conversation", "kept_positions"}
EXTENSIONS |= {"select_ms", "ttft_ms", "admit_ms", "tokenize_ms", "queue_ms", "submit_ms", "server_ms", "host_ms"}


def _extras(value: Any) -> set[str]:
    """Every field of a parsed response that its openai type does not declare, at any depth."""
    from pydantic import BaseModel

    if isinstance(value, BaseModel):
        found = set(value.model_extra or {})
        for name in type(value).model_fields:
            found |= _extras(getattr(value, name))
        return found
    if isinstance(value, list):
        return set().union(*map(_extras, value)) if value else set()
    return set()


def _contract(kind: Any, payload: dict[str, Any]) -> Any:
    """``payload`` parsed by the openai package's type, strictly: no required field missing, no type coerced."""
    parsed = kind.model_validate(payload, strict=True)
    assert _extras(parsed) <= EXTENSIONS, (kind.__name__, _extras(parsed) - EXTENSIONS)
    # the extension's own objects are whole too: usage.specprefill carries its fields
    usage = payload.get("usage") or {}
    if "specprefill" in usage:
        assert {"kept_tokens", "keep_ratio", "score_ms", "prefill_ms", "fallback"} <= set(usage["specprefill"])
    return parsed


def _sse_payloads(url: str, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    with httpx.stream("POST", f"{url}{path}", json=body, timeout=120) as response:
        assert response.status_code == 200
        data = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return [httpx.Response(200, content=d).json() for d in data[:-1]]


def test_every_response_shape_parses_as_the_openai_packages_types(url: str) -> None:
    from openai.types import Completion, Model
    from openai.types.chat import ChatCompletion, ChatCompletionChunk

    chat = {"model": MODEL, "messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 1}
    text = {"model": MODEL, "prompt": "Colours: red, green,", "max_tokens": 1}
    ids = {"specprefill": {"return_token_ids": True}}
    scored = {**chat, "messages": [{"role": "user", "content": _long_text()}]}
    logprobs = {"logprobs": True, "top_logprobs": 2}
    conversation = {"specprefill": {"conversation_start": True}}
    for body in (
        scored,
        {**chat, **ids},
        {**chat, **conversation},
        {**chat, **logprobs},
        {**chat, **conversation, **logprobs},
    ):
        answer = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)
        assert answer.status_code == 200, answer.text
        parsed = _contract(ChatCompletion, answer.json())
        assert parsed.choices[0].message.role == "assistant" and parsed.usage is not None
    for body in (text, {**text, **ids}, {**text, "logprobs": 3}):
        _contract(Completion, httpx.post(f"{url}/v1/completions", json=body, timeout=120).json())
    usage = {"stream": True, "stream_options": {"include_usage": True}}
    for body in ({**chat, "stream": True}, {**chat, **usage, **ids}, {**chat, **usage, **logprobs}):
        chunks = [_contract(ChatCompletionChunk, p) for p in _sse_payloads(url, "/v1/chat/completions", body)]
        assert chunks[0].choices[0].delta.role == "assistant"
        if "logprobs" in body:
            assert any(c.choices and c.choices[0].logprobs and c.choices[0].logprobs.content for c in chunks)
    for body in ({**text, "stream": True}, {**text, **usage, **ids}, {**text, "stream": True, "logprobs": 0}):
        payloads = _sse_payloads(url, "/v1/completions", body)
        # OpenAI streams text chunks with "finish_reason": null until the last (as vLLM does), which the
        # openai package's Completion type does not admit; its client builds chunks without validating.
        for payload in payloads:
            for choice in payload["choices"]:
                if choice["finish_reason"] is None:
                    choice["finish_reason"] = "length"
        chunks = [_contract(Completion, p) for p in payloads]
        assert (chunks[-1].usage is not None) == ("stream_options" in body)
    listed = httpx.get(f"{url}/v1/models", timeout=60).json()
    assert listed["object"] == "list" and listed["data"]
    for card in listed["data"]:
        _contract(Model, card)
    _contract(Model, httpx.get(f"{url}/v1/models/{MODEL}", timeout=60).json())


ERROR_REQUESTS: list[tuple[str, str, Any]] = [
    ("POST", "/v1/chat/completions", {"messages": "Hi"}),  # schema
    ("POST", "/v1/chat/completions", {"messages": HI, "n": 2}),  # unsupported
    ("POST", "/v1/chat/completions", {"messages": HI, "model": "gpt-4o"}),  # unknown model
    ("POST", "/v1/completions", b'{"prompt": '),  # malformed JSON
    ("POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 10_000}),  # over --max-output-tokens
    ("GET", "/v1/conversations/none-such", None),  # unknown conversation
    ("GET", "/v1/chat/completions", None),  # wrong method
    ("POST", "/v1/embeddings", {"input": "x"}),  # unknown route
    ("POST", "/v1/completions", b"{" + b" " * (5 << 20) + b"}"),  # too large
]


@pytest.mark.parametrize(("method", "path", "body"), ERROR_REQUESTS, ids=[f"{m} {p}" for m, p, _ in ERROR_REQUESTS])
def test_every_error_parses_as_the_openai_packages_error_object(url: str, method: str, path: str, body: Any) -> None:
    from openai.types import ErrorObject

    kwargs: dict[str, Any] = {"timeout": 60}
    if isinstance(body, bytes):
        kwargs |= {"content": body, "headers": {"Content-Type": "application/json"}}
    elif body is not None:
        kwargs["json"] = body
    response = httpx.request(method, f"{url}{path}", **kwargs)
    assert 400 <= response.status_code < 500, response.text
    assert set(response.json()) == {"error"}
    error = ErrorObject.model_validate(response.json()["error"], strict=True)
    assert error.message and error.type and not error.model_extra
