"""Random request bodies against a real server app (uvicorn on 127.0.0.1, in this process): valid-ish
bodies with random values in the right places, bodies of arbitrary JSON, and bytes that are not JSON.
Whatever arrives, the answer is never a 5xx, and every 4xx carries an OpenAI-style error body.

Bounded and reproducible: a fixed number of examples per route, derandomized, no example database;
the server generates at most 2 tokens and accepts at most 48 prompt tokens, so what passes
validation is answered quickly.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from server_utils import serve_in_thread

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m"
EXAMPLES = 60

FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.fixture(scope="module")
def url(smollm: Any) -> Iterator[str]:
    from specprefill_sdk.backends import TransformersBackend
    from specprefill_sdk.scoring import DraftAttentionScorer
    from specprefill_sdk.server import ServerConfig, create_app

    config = ServerConfig(policy="paper", max_prompt_tokens=48, max_output_tokens=2, default_max_tokens=2)
    app = create_app(config, backend=TransformersBackend(smollm), scorer=DraftAttentionScorer(smollm))
    with serve_in_thread(app) as base:
        yield base


# ----------------------------------------------------------------------------- strategies
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
)
json_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10), inner, max_size=4)),
    max_leaves=12,
)
small_ints = st.one_of(st.integers(min_value=-3, max_value=70), json_values)
rates = st.one_of(st.floats(min_value=-0.5, max_value=1.5), st.sampled_from([0, 1, 0.0, 1.0, 0.1]), json_values)
words = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40)

specprefill = st.fixed_dictionaries(
    {},
    optional={
        "enabled": st.one_of(st.booleans(), json_values),
        "policy": st.one_of(st.sampled_from(["paper", "auto", "adaptive", "dense", "nope", ""]), json_values),
        "keep_rate": rates,
        "token_budget": small_ints,
        "chunk_size": small_ints,
        "look_ahead": small_ints,
        "pool_kernel": small_ints,
        "layers": small_ints,
        "min_prompt_tokens": small_ints,
        "sink": small_ints,
        "tail": st.one_of(st.booleans(), small_ints),
        "roles": st.one_of(st.lists(st.sampled_from(["system", "user", "", "x" * 70]), max_size=3), json_values),
        "last_user_turn": st.one_of(st.booleans(), json_values),
        "special_tokens": st.one_of(st.booleans(), json_values),
        "prompt_token_ids": st.one_of(st.lists(st.integers(min_value=-2, max_value=60000), max_size=6), json_values),
        "position_ids": st.one_of(st.lists(st.integers(min_value=-2, max_value=100), max_size=6), json_values),
        "prompt_length": small_ints,
        "return_token_ids": st.one_of(st.booleans(), json_values),
        "conversation_id": st.one_of(st.text(max_size=12), json_values),
        "conversation_start": st.one_of(st.booleans(), json_values),
        "conversation_strategy": st.one_of(st.sampled_from(["recompute", "incremental", "refresh", "x"]), json_values),
        "unknown_option": json_values,
    },
)
sampling = {
    "model": st.one_of(st.just(MODEL), st.text(max_size=10), json_values),
    "max_tokens": small_ints,
    "temperature": rates,
    "top_p": rates,
    "stop": st.one_of(words, st.lists(words, max_size=5), json_values),
    "seed": st.one_of(st.integers(min_value=-1, max_value=2**64), json_values),
    "n": small_ints,
    "stream": st.one_of(st.booleans(), json_values),
    "stream_options": st.one_of(st.fixed_dictionaries({"include_usage": st.booleans()}), json_values),
    "user": st.one_of(words, json_values),
    "specprefill": st.one_of(specprefill, json_values),
    "unknown_field": json_values,
}
message = st.fixed_dictionaries(
    {},
    optional={
        "role": st.one_of(st.sampled_from(["system", "user", "assistant", "tool", ""]), json_values),
        "content": st.one_of(
            words,
            st.lists(
                st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url", ""]), "text": words}), max_size=2
            ),
            json_values,
        ),
        "name": st.one_of(words, json_values),
    },
)
messages = st.one_of(st.lists(message, max_size=3), json_values)
chat_bodies = st.fixed_dictionaries(
    {},
    optional={
        **sampling,
        "messages": messages,
        "max_completion_tokens": small_ints,
        "logprobs": json_values,
        "tools": json_values,
    },
)
completion_bodies = st.fixed_dictionaries(
    {},
    optional={
        **sampling,
        "prompt": st.one_of(
            words, st.lists(words, max_size=2), st.lists(st.integers(-2, 60000), max_size=4), json_values
        ),
        "echo": json_values,
        "best_of": small_ints,
        "suffix": st.one_of(words, json_values),
        "logprobs": json_values,
    },
)
tokenize_bodies = st.fixed_dictionaries(
    {},
    optional={
        "model": st.one_of(st.just(MODEL), json_values),
        "messages": messages,
        "prompt": st.one_of(words, json_values),
        "add_generation_prompt": st.one_of(st.booleans(), json_values),
        "unknown_field": json_values,
    },
)


def bodies(valid_ish: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[bytes]:
    """Mostly valid-ish bodies, some arbitrary JSON, some bytes that are not JSON at all."""
    as_json = st.one_of(valid_ish, valid_ish, valid_ish, json_values).map(lambda v: json.dumps(v).encode())
    return st.one_of(as_json, as_json, as_json, st.binary(max_size=40))


def check(url: str, path: str, body: bytes) -> None:
    response = httpx.post(url + path, content=body, headers={"Content-Type": "application/json"}, timeout=120)
    shown = body[:300]
    assert response.status_code < 500, (shown, response.status_code, response.text[:500])
    if response.status_code >= 400:
        payload = response.json()
        assert set(payload) == {"error"}, (shown, payload)
        error = payload["error"]
        assert set(error) == {"message", "type", "param", "code"}, (shown, error)
        assert isinstance(error["message"], str) and error["message"], (shown, error)
        assert isinstance(error["type"], str) and error["type"], (shown, error)
        assert error["param"] is None or isinstance(error["param"], str), (shown, error)
    elif not response.headers.get("content-type", "").startswith("text/event-stream"):
        assert isinstance(response.json(), dict)


@FUZZ
@given(body=bodies(chat_bodies))
def test_chat_completions_never_answer_5xx(url: str, body: bytes) -> None:
    check(url, "/v1/chat/completions", body)


@FUZZ
@given(body=bodies(completion_bodies))
def test_completions_never_answer_5xx(url: str, body: bytes) -> None:
    check(url, "/v1/completions", body)


@FUZZ
@given(body=bodies(tokenize_bodies))
def test_tokenize_never_answers_5xx(url: str, body: bytes) -> None:
    check(url, "/v1/tokenize", body)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}),
        ("/v1/completions", {"prompt": "Hi", "specprefill": {"keep_rate": 0.5, "chunk_size": 1}}),
        ("/v1/tokenize", {"messages": [{"role": "user", "content": "Hi"}]}),
    ],
)
def test_a_valid_body_is_answered_on_each_fuzzed_route(url: str, path: str, body: dict[str, Any]) -> None:
    # The fuzzed server serves: the routes above are not refusing everything.
    response = httpx.post(url + path, json=body, timeout=120)
    assert response.status_code == 200, response.text
