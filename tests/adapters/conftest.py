"""Fixtures of the adapter tests: the adapters importable from the checkout, pipelines over SmolLM2."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ADAPTERS = Path(__file__).resolve().parents[2] / "adapters"
# An editable install maps adapters/ already; a plain checkout needs it on the path.
if str(ADAPTERS) not in sys.path:
    sys.path.insert(0, str(ADAPTERS))


@pytest.fixture(scope="session")
def paper_pipeline(smollm):
    """The paper's method with a 30% keep rate: compresses every prompt long enough to have chunks.

    ``dense_below_tokens=0`` asks for compression of short prompts too (the presets prefill them whole).
    """
    from specprefill_sdk.policies import load_pipeline

    return load_pipeline("paper", model=smollm, keep_rate=0.3, dense_below_tokens=0)


@pytest.fixture(scope="session")
def dense_pipeline(smollm):
    """The auto policy: short prompts are prefilled whole, without the draft (fast chat tests)."""
    from specprefill_sdk.policies import load_pipeline

    return load_pipeline("auto", model=smollm)


@pytest.fixture(scope="session")
def documents(essay):
    """Three documents of different topics cut from real text, plus a short factual one."""
    return [essay[:900], "The Louvre museum is in Paris. It opened in 1793 and holds the Mona Lisa.", essay[900:2000]]


@pytest.fixture(scope="session")
def server_base(smollm):
    """Our OpenAI-compatible server (SmolLM2, policy paper) in a thread on 127.0.0.1: ``http://127.0.0.1:PORT``."""
    from server_utils import serve_in_thread

    from specprefill_sdk.server import ServerConfig, create_app

    config = ServerConfig(model="smollm2-135m", device="cpu", dtype="auto", policy="paper")
    with serve_in_thread(create_app(config)) as base:
        yield base
