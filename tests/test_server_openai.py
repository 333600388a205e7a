"""The OpenAI surface clients rely on, against apps built here and served by uvicorn on 127.0.0.1:
defaults, fields that are refused rather than ignored, vLLM's extensions and routes, request ids,
keep-alive comments, and every response shape parsed by the `openai` package's own types.

The apps share the session's loaded SmolLM2 (no second copy of the weights).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest
from server_utils import serve_in_thread

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m"


@pytest.fixture(scope="module")
def backend(smollm: Any) -> Any:
    from specprefill_sdk.backends import TransformersBackend

    return TransformersBackend(smollm)


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
