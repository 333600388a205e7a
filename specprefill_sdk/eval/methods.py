"""The compared methods: draft-attention variants and baselines, each a scorer plus a selector.

Every method keeps the same tokens by force (`Protect`: the attention sink, the generation prompt and
the task's question, which the prompt marks protected), and protected tokens count toward the keep
rate. Methods that share ``scorer_key`` share one scoring pass per sample.

Example::

    methods = build_methods(["draft-chunked", "random"], draft=loaded_draft, seed=0)
    methods[0].selector(0.1).name  # 'Protect(Chunked(KeepRate(0.1), 32))'
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidRequestError
from ..interfaces import Scorer, Selector
from ..models import LoadedModel

__all__ = [
    "DEFAULT_METHODS",
    "METHOD_DESCRIPTIONS",
    "Method",
    "build_methods",
    "is_method",
    "method_description",
    "method_names",
    "method_order",
]

logger = logging.getLogger(__name__)

#: Method name -> one-line description (the order results list them in).
METHOD_DESCRIPTIONS: dict[str, str] = {
    "draft-token": "draft attention, look-ahead 8, no pooling, token-level top-k",
    "draft-pooled": "draft attention, look-ahead 8, pool 13, token-level top-k",
    "draft-chunked": "draft attention, look-ahead 8, pool 13, chunks of 32 (the paper's setting)",
    "draft-structured": "draft attention, look-ahead 8, pool 13, chunks of 8 to 64 tokens cut at sentence, line, "
    "paragraph and message breaks",
    "draft-chunked-la1": "draft attention, look-ahead 1, pool 13, chunks of 32",
    "draft-adaptive": "draft attention, look-ahead 8, pool 13, chunks of 32, Adaptive(coverage 0.9) "
    "up to the keep rate",
    "draft-early": "draft attention from the first half of the draft's layers only (the rest never run), "
    "look-ahead 1, pool 13, chunks of 32",
    "random": "random scores (seeded), token-level top-k",
    "recency": "the most recent tokens",
    "head-tail": "half of the kept tokens from the start, half from the end",
    "self-info": "LLMLingua-style self-information -log p(token | prefix) from the same draft, token-level top-k",
    "llmlingua": "the llmlingua package (LLMLingua-1 PromptCompressor, iterative token filter) on the same "
    "draft model folder; kept tokens mapped back onto the prompt",
}

#: Methods run when none are named.
DEFAULT_METHODS: tuple[str, ...] = tuple(METHOD_DESCRIPTIONS)

#: Chunk size of the chunked methods (the paper's).
CHUNK = 32

#: ``draft-early-N``: `draft-early` with the draft's first N layers (any N from 1 to the draft's depth)
_EARLY = re.compile(r"draft-early-([1-9][0-9]*)")


def method_names() -> list[str]:
    """Every fixed method name, in result order (``draft-early-N`` names come after ``draft-early``)."""
    return list(METHOD_DESCRIPTIONS)


def method_description(name: str) -> str | None:
    """The one-line description of method ``name``, or None for an unknown name."""
    early = _EARLY.fullmatch(name)
    if early:
        return (
            f"draft attention from the draft's first {early.group(1)} layers only (the rest never run), "
            "look-ahead 1, pool 13, chunks of 32"
        )
    return METHOD_DESCRIPTIONS.get(name)


def is_method(name: str) -> bool:
    """Whether ``name`` names a method (a fixed name, or ``draft-early-N``)."""
    return method_description(name) is not None


def method_order(names: Sequence[str]) -> list[str]:
    """``names`` in result order: fixed methods in `METHOD_DESCRIPTIONS` order, each ``draft-early-N``
    after ``draft-early`` by N, unknown names last as given."""

    def key(item: tuple[int, str]) -> tuple[int, int, int]:
        position, name = item
        early = _EARLY.fullmatch(name)
        fixed = list(METHOD_DESCRIPTIONS)
        if early:
            return (fixed.index("draft-early"), 1 + int(early.group(1)), position)
        if name in METHOD_DESCRIPTIONS:
            return (fixed.index(name), 0, position)
        return (len(fixed), 0, position)

    return [name for _, name in sorted(enumerate(names), key=key)]


@dataclass(frozen=True)
class Method:
    """A named way of choosing kept tokens: ``scorer`` scores once, ``selector(rate)`` selects per rate.

    ``scorer`` is None for `llmlingua`, which selects by itself (see `specprefill_sdk.eval.llmlingua`).
    """

    name: str
    description: str
    scorer_key: str
    scorer: Scorer | None
    selector: Callable[[float], Selector]
    uses_draft: bool


def _protect(inner: Any) -> Selector:
    from ..selection import Protect

    return Protect(inner, sink=1, tail=True)


def build_methods(
    names: Sequence[str], *, draft: LoadedModel | None, seed: int = 0, target_tokenizer: Any = None
) -> list[Method]:
    """Build the named methods; draft-based ones share the loaded ``draft``.

    Raises:
        InvalidRequestError: an unknown method name, or a draft-based method without a draft.
    """
    from ..scoring import (
        DraftAttentionScorer,
        HeadTailScorer,
        RandomScorer,
        RecencyScorer,
        SelfInformationScorer,
    )
    from ..selection import Adaptive, Chunked, KeepRate, StructuredChunks

    unknown = [n for n in names if not is_method(n)]
    if unknown:
        raise InvalidRequestError(
            f"unknown method(s) {', '.join(unknown)}; choose from {', '.join(METHOD_DESCRIPTIONS)} or draft-early-N",
            param="methods",
        )
    needs_draft = [n for n in names if n.startswith("draft-") or n in ("self-info", "llmlingua")]
    if needs_draft and draft is None:
        raise InvalidRequestError(f"methods {', '.join(needs_draft)} need a draft model", param="draft")

    base: DraftAttentionScorer | None = None
    if any(n.startswith("draft-") for n in names):
        assert draft is not None
        base = DraftAttentionScorer(draft, look_ahead=8, pool_kernel=13, target_tokenizer=target_tokenizer)

    def token_level(rate: float) -> Selector:
        return _protect(KeepRate(rate))

    def chunked(rate: float) -> Selector:
        return _protect(Chunked(KeepRate(rate), CHUNK))

    def structured(rate: float) -> Selector:
        return _protect(StructuredChunks(KeepRate(rate)))

    def adaptive(rate: float) -> Selector:
        return _protect(
            Chunked(Adaptive(coverage=0.9, min_rate=min(0.02, rate), max_rate=rate, dense_below_tokens=0), CHUNK)
        )

    def early(name: str) -> Method:
        assert base is not None
        depth = base.depth
        match = _EARLY.fullmatch(name)
        layers = int(match.group(1)) if match else max(1, depth // 2)
        if layers > depth:
            raise InvalidRequestError(f"{name}: the draft has {depth} layers", param="methods")
        scorer = base.with_options(look_ahead=1, layers=layers)
        return Method(name, str(method_description(name)), f"draft-la1-pool13-layers{layers}", scorer, chunked, True)

    out: list[Method] = []
    for name in names:
        desc = str(method_description(name))
        if name == "draft-early" or _EARLY.fullmatch(name):
            out.append(early(name))
        elif name == "draft-token":
            assert base is not None
            out.append(Method(name, desc, "draft-la8-pool1", base.with_options(pool_kernel=1), token_level, True))
        elif name == "draft-pooled":
            assert base is not None
            out.append(Method(name, desc, "draft-la8-pool13", base, token_level, True))
        elif name == "draft-chunked":
            assert base is not None
            out.append(Method(name, desc, "draft-la8-pool13", base, chunked, True))
        elif name == "draft-structured":
            assert base is not None
            out.append(Method(name, desc, "draft-la8-pool13", base, structured, True))
        elif name == "draft-chunked-la1":
            assert base is not None
            out.append(Method(name, desc, "draft-la1-pool13", base.with_options(look_ahead=1), chunked, True))
        elif name == "draft-adaptive":
            assert base is not None
            out.append(Method(name, desc, "draft-la8-pool13", base, adaptive, True))
        elif name == "random":
            out.append(Method(name, desc, f"random-{seed}", RandomScorer(seed=seed), token_level, False))
        elif name == "recency":
            out.append(Method(name, desc, "recency", RecencyScorer(), token_level, False))
        elif name == "head-tail":
            out.append(Method(name, desc, "head-tail", HeadTailScorer(head=0.5), token_level, False))
        elif name == "self-info":
            assert draft is not None
            out.append(
                Method(
                    name,
                    desc,
                    "self-info",
                    SelfInformationScorer(draft, target_tokenizer=target_tokenizer),
                    token_level,
                    True,
                )
            )
        elif name == "llmlingua":
            out.append(Method(name, desc, "llmlingua", None, token_level, True))
    return out
