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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidRequestError
from ..interfaces import Scorer, Selector
from ..models import LoadedModel

__all__ = ["DEFAULT_METHODS", "METHOD_DESCRIPTIONS", "Method", "build_methods", "method_names"]

logger = logging.getLogger(__name__)

#: Method name -> one-line description (the order results list them in).
METHOD_DESCRIPTIONS: dict[str, str] = {
    "draft-token": "draft attention, look-ahead 8, no pooling, token-level top-k",
    "draft-pooled": "draft attention, look-ahead 8, pool 13, token-level top-k",
    "draft-chunked": "draft attention, look-ahead 8, pool 13, chunks of 32 (the paper's setting)",
    "draft-chunked-la1": "draft attention, look-ahead 1, pool 13, chunks of 32",
    "draft-adaptive": "draft attention, look-ahead 8, pool 13, chunks of 32, Adaptive(coverage 0.9) "
    "up to the keep rate",
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


def method_names() -> list[str]:
    """Every method name, in result order."""
    return list(METHOD_DESCRIPTIONS)


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
    from ..selection import Adaptive, Chunked, KeepRate

    unknown = [n for n in names if n not in METHOD_DESCRIPTIONS]
    if unknown:
        raise InvalidRequestError(
            f"unknown method(s) {', '.join(unknown)}; choose from {', '.join(METHOD_DESCRIPTIONS)}", param="methods"
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

    def adaptive(rate: float) -> Selector:
        return _protect(
            Chunked(Adaptive(coverage=0.9, min_rate=min(0.02, rate), max_rate=rate, dense_below_tokens=0), CHUNK)
        )

    out: list[Method] = []
    for name in names:
        desc = METHOD_DESCRIPTIONS[name]
        if name == "draft-token":
            assert base is not None
            out.append(Method(name, desc, "draft-la8-pool1", base.with_options(pool_kernel=1), token_level, True))
        elif name == "draft-pooled":
            assert base is not None
            out.append(Method(name, desc, "draft-la8-pool13", base, token_level, True))
        elif name == "draft-chunked":
            assert base is not None
            out.append(Method(name, desc, "draft-la8-pool13", base, chunked, True))
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
