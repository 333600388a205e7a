"""The contract list: every Scorer, Selector and Backend of the package, and how to build each.

`tests/test_contracts.py` runs each entry through its protocol's contract (types in, types out,
errors typed, batch equal to singles). A new component is tested by being listed here; a class the
package exports and this list lacks fails ``test_every_exported_component_is_listed``.

An entry's ``build`` gets ``fixture(name)`` (pytest's ``request.getfixturevalue``), so loaded models
and started servers are shared through the session- and module-scoped fixtures of ``conftest.py``
and ``test_contracts.py``.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from specprefill_sdk.backends import OpenAIBackend, TransformersBackend, VLLMBackend
from specprefill_sdk.scoring import (
    DraftAttentionScorer,
    HeadTailScorer,
    QueuedScorer,
    RandomScorer,
    RecencyScorer,
    ScoringQueue,
    SelfInformationScorer,
    UniformScorer,
)
from specprefill_sdk.selection import Adaptive, Chunked, DenseBelow, KeepRate, Protect, StructuredChunks, TokenBudget

Fixture = Callable[[str], Any]


@dataclass(frozen=True)
class Entry:
    """One component to put through its contract.

    ``cls``: the exported class it covers; ``build(fixture)``: the component; ``invalid``: ways to
    build it wrongly, each of which must raise a `SpecPrefillError` subclass; ``skip``: why it cannot
    run here (None: it runs); ``exact``: a backend that prefills at the original positions.
    """

    id: str
    cls: type
    build: Callable[[Fixture], Any]
    invalid: tuple[Callable[[], Any], ...] = ()
    skip: str | None = None
    exact: bool = True
    options: dict[str, Any] = field(default_factory=dict)


def _draft(**knobs: Any) -> Callable[[Fixture], Any]:
    return lambda fixture: DraftAttentionScorer(fixture("smollm_fp32"), **knobs)


def _cannot_draft(**knobs: Any) -> Callable[[], Any]:
    """A draft scorer built with invalid knobs (the model is loaded once per process)."""

    def build() -> Any:
        from specprefill_sdk.models import load_model

        return DraftAttentionScorer(load_model("smollm2-135m", device="cpu", dtype="float32", progress=False), **knobs)

    return build


SCORERS: list[Entry] = [
    Entry(
        "draft-attention",
        DraftAttentionScorer,
        _draft(),
        invalid=(_cannot_draft(look_ahead=0), _cannot_draft(pool_kernel=0), _cannot_draft(layers=4)),
    ),
    Entry("draft-attention-look-ahead-1", DraftAttentionScorer, _draft(look_ahead=1, pool_kernel=5)),
    Entry(
        "draft-attention-4-layers",
        DraftAttentionScorer,
        _draft(look_ahead=1, layers=4),
        invalid=(_cannot_draft(look_ahead=1, layers=0), _cannot_draft(look_ahead=1, layers=10**3)),
    ),
    Entry(
        "self-information",
        SelfInformationScorer,
        lambda fixture: SelfInformationScorer(fixture("smollm_fp32"), chunk_size=64),
        invalid=(lambda: SelfInformationScorer("smollm2-135m", chunk_size=0),),
    ),
    Entry(
        "queued-draft-attention",
        QueuedScorer,
        lambda fixture: QueuedScorer(DraftAttentionScorer(fixture("smollm_fp32")), ScoringQueue(max_wait_ms=0.0)),
    ),
    Entry("uniform", UniformScorer, lambda fixture: UniformScorer()),
    Entry("random", RandomScorer, lambda fixture: RandomScorer(seed=3), invalid=(lambda: RandomScorer(seed=0.5),)),  # type: ignore[arg-type]
    Entry("recency", RecencyScorer, lambda fixture: RecencyScorer()),
    Entry("head-tail", HeadTailScorer, lambda fixture: HeadTailScorer(0.25), invalid=(lambda: HeadTailScorer(1.5),)),
]

# Positional arguments where a keyword may still be renamed; the rate, count, size and threshold of
# each stay in the same place.
SELECTORS: list[Entry] = [
    Entry("keep-rate", KeepRate, lambda f: KeepRate(0.3), invalid=(lambda: KeepRate(0), lambda: KeepRate(1.5))),
    Entry("keep-all", KeepRate, lambda f: KeepRate(1.0)),
    Entry("token-budget", TokenBudget, lambda f: TokenBudget(20), invalid=(lambda: TokenBudget(0),)),
    Entry(
        "chunked",
        Chunked,
        lambda f: Chunked(KeepRate(0.3), 8),
        invalid=(lambda: Chunked(KeepRate(0.3), 0), lambda: Chunked(Protect(KeepRate(0.3)), 8)),  # type: ignore[arg-type]
    ),
    Entry("chunked-token-budget", Chunked, lambda f: Chunked(TokenBudget(24), 8)),
    Entry("chunked-one-chunk", Chunked, lambda f: Chunked(KeepRate(0.5), 4096)),
    Entry(
        "structured-chunks",
        StructuredChunks,
        lambda f: StructuredChunks(KeepRate(0.3), 4, 16),
        invalid=(
            lambda: StructuredChunks(KeepRate(0.3), 0),
            lambda: StructuredChunks(KeepRate(0.3), 8, 10),
            lambda: StructuredChunks(KeepRate(0.3), fallback_size=0),
            lambda: StructuredChunks(Protect(KeepRate(0.3))),  # type: ignore[arg-type]
        ),
    ),
    Entry("structured-chunks-token-budget", StructuredChunks, lambda f: StructuredChunks(TokenBudget(24))),
    Entry(
        "protect-structured-chunks",
        Protect,
        lambda f: Protect(StructuredChunks(KeepRate(0.2)), roles=("system",), special_tokens=True),
    ),
    Entry(
        "adaptive",
        Adaptive,
        lambda f: Adaptive(0.8, 0.1, 0.6, 0),
        invalid=(lambda: Adaptive(0.8, 0.6, 0.5), lambda: Adaptive(1.2), lambda: Adaptive(0.9, 0.05, 0.5, -1)),
    ),
    Entry("adaptive-dense-below", Adaptive, lambda f: Adaptive(0.9, 0.05, 0.5, 10_000)),
    Entry("protect", Protect, lambda f: Protect(KeepRate(0.3)), invalid=(lambda: Protect(object()),)),  # type: ignore[arg-type]
    Entry(
        "protect-chat",
        Protect,
        lambda f: Protect(Chunked(KeepRate(0.2), 8), roles=("system",), last_user_turn=True, special_tokens=True),
        invalid=(lambda: Protect(KeepRate(0.2), sink=-1), lambda: Protect(KeepRate(0.2), spans=((5, 2),))),
    ),
    Entry("protect-nested", Protect, lambda f: Protect(Protect(KeepRate(0.2), sink=4), tail=3)),
    Entry(
        "dense-below",
        DenseBelow,
        lambda f: DenseBelow(Protect(Chunked(KeepRate(0.1), 8)), 100),
        invalid=(lambda: DenseBelow(KeepRate(0.1), -1), lambda: DenseBelow(object())),  # type: ignore[arg-type]
    ),
    Entry("dense-below-everything", DenseBelow, lambda f: DenseBelow(KeepRate(0.2), 10_000)),
]


def _no_vllm() -> str | None:
    if importlib.util.find_spec("vllm") is None:
        return "vllm is not installed"
    import torch

    return None if torch.cuda.is_available() else "VLLMBackend needs a CUDA GPU"


def _vllm(fixture: Fixture) -> Any:
    return VLLMBackend("smollm2-135m", dtype="float32", gpu_memory_utilization=0.3, max_model_len=2048)


BACKENDS: list[Entry] = [
    Entry(
        "transformers",
        TransformersBackend,
        lambda fixture: TransformersBackend(fixture("smollm_fp32")),
        invalid=(lambda: TransformersBackend("smollm2-135m", prefill_chunk=0),),
    ),
    Entry(
        "openai-positions",
        OpenAIBackend,
        lambda fixture: OpenAIBackend(
            fixture("contract_server").api, model="smollm2-135m", tokenizer=fixture("tokenizer"), mode="positions"
        ),
        invalid=(
            lambda: OpenAIBackend("127.0.0.1:8000", model="smollm2-135m", tokenizer="smollm2-135m"),
            lambda: OpenAIBackend("http://127.0.0.1:1/v1", model="m", tokenizer="smollm2-135m", mode="exact"),  # type: ignore[arg-type]
        ),
    ),
    Entry(
        "openai-text",
        OpenAIBackend,
        lambda fixture: OpenAIBackend(
            fixture("contract_server").api, model="smollm2-135m", tokenizer=fixture("tokenizer"), mode="text"
        ),
        exact=False,
    ),
    Entry("vllm", VLLMBackend, _vllm, skip=_no_vllm()),
]
