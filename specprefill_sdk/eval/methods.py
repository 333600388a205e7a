"""The compared methods: draft-attention variants and baselines, each a scorer plus a selector.

Every fixed method keeps the same tokens by force (`Protect`: the attention sink, the generation prompt and
the task's question, which the prompt marks protected), and protected tokens count toward the keep
rate. Methods that share ``scorer_key`` share one scoring pass per sample.

A policy method, ``policy:NAME`` (a preset or a ``.toml`` path; ``auto`` is short for
``policy:auto``), is what users get from that policy: its scorer on the loaded draft and its own
selector, which decides the keep share itself, so it runs once, not at each keep rate.

Example::

    methods = build_methods(["draft-chunked", "random"], draft=loaded_draft, seed=0)
    methods[0].selector(0.1).name  # 'Protect(Chunked(KeepRate(0.1), 32))'

Parameterised names: ``draft-early-N`` (the draft's first N layers), ``draft-early-N-AGG`` (the same
with the layer aggregation AGG: ``mean``, ``content-mean`` or ``last-layer``; plain is ``max``) and
``target-early-N[-AGG]`` (the target model's own first N layers score, no second model).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from ..errors import InvalidRequestError, PolicyError
from ..interfaces import Scorer, Selector
from ..models import LoadedModel
from ..policies import MODEL_SCORERS, draft_variant
from ..types import Aggregation

if TYPE_CHECKING:
    from ..policies import Policy

__all__ = [
    "DEFAULT_METHODS",
    "EARLY_AGGREGATIONS",
    "METHOD_DESCRIPTIONS",
    "Method",
    "build_methods",
    "is_method",
    "method_description",
    "method_names",
    "method_order",
    "policy_of",
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
    "draft-chunked-qmax": "draft attention, look-ahead 8, pool 13, max over the look-ahead queries instead of "
    "their mean, chunks of 32",
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

#: The layer aggregations an early-layer method's name may end with (none: ``"max"``), in result order.
EARLY_AGGREGATIONS: tuple[Aggregation, ...] = ("mean", "content-mean", "last-layer")

#: ``draft-early-N[-AGG]`` / ``target-early-N[-AGG]``: the first N layers of the draft / of the target
#: (any N from 1 to the model's depth), aggregated by AGG (`EARLY_AGGREGATIONS`; none: ``"max"``)
_EARLY = re.compile(r"(draft|target)-early-([1-9][0-9]*)(?:-(" + "|".join(EARLY_AGGREGATIONS) + r"))?")


#: Method names that are short for ``policy:NAME``.
_POLICY_SHORTHANDS: dict[str, str] = {"auto": "auto"}
_POLICY_PREFIX = "policy:"


def policy_of(name: str) -> str | None:
    """The policy (a preset name or a ``.toml`` path) that method ``name`` runs, or None for another method.

    ``policy:NAME`` runs policy NAME and ``auto`` is short for ``policy:auto``; whether the policy
    exists is `method_description`'s question.
    """
    if name in _POLICY_SHORTHANDS:
        return _POLICY_SHORTHANDS[name]
    if name.startswith(_POLICY_PREFIX) and len(name) > len(_POLICY_PREFIX):
        return name[len(_POLICY_PREFIX) :]
    return None


def _load(name: str) -> Policy | None:
    from ..policies import load_policy

    spec = policy_of(name)
    if spec is None:
        return None
    try:
        return load_policy(spec)
    except PolicyError:
        return None


def method_names() -> list[str]:
    """Every fixed method name, in result order (``draft-early-N`` and ``target-early-N`` names come after
    ``draft-early``)."""
    return list(METHOD_DESCRIPTIONS)


def _early(name: str) -> tuple[str, int, Aggregation] | None:
    """``(model, N, aggregation)`` of an early-layer method name (model ``draft`` or ``target``), else None."""
    match = _EARLY.fullmatch(name)
    if match is None:
        return None
    return match.group(1), int(match.group(2)), cast("Aggregation", match.group(3) or "max")


def method_description(name: str) -> str | None:
    """The one-line description of method ``name``, or None for an unknown name (or policy)."""
    if policy_of(name) is not None:
        policy = _load(name)
        if policy is None:
            return None
        return f"the {policy.name} policy as users get it, keep share its own: {policy.summary()}"
    early = _early(name)
    if early:
        model, layers, aggregation = early
        how = "" if aggregation == "max" else f", layer aggregation {aggregation}"
        return (
            f"draft attention from the {model}'s first {layers} layers only (the rest never run), "
            f"look-ahead 1, pool 13{how}, chunks of 32"
        )
    return METHOD_DESCRIPTIONS.get(name)


def is_method(name: str) -> bool:
    """Whether ``name`` names a method (a fixed name, ``draft-early-N[-AGG]``, ``target-early-N[-AGG]``
    or ``policy:NAME`` / ``auto`` with a policy that loads)."""
    return method_description(name) is not None


def method_order(names: Sequence[str]) -> list[str]:
    """``names`` in result order: fixed methods in `METHOD_DESCRIPTIONS` order; after ``draft-early``
    each ``draft-early-N[-AGG]`` by N (then AGG), then each ``target-early-N[-AGG]`` likewise; unknown
    names last as given."""

    def key(item: tuple[int, str]) -> tuple[int, int, int, int, int]:
        position, name = item
        early = _early(name)
        fixed = list(METHOD_DESCRIPTIONS)
        if early:
            model, layers, aggregation = early
            family = 1 if model == "draft" else 2
            rank = 0 if aggregation == "max" else 1 + EARLY_AGGREGATIONS.index(aggregation)
            return (fixed.index("draft-early"), family, layers, rank, position)
        if name in METHOD_DESCRIPTIONS:
            return (fixed.index(name), 0, 0, 0, position)
        return (len(fixed), 0, 0, 0, position)

    return [name for _, name in sorted(enumerate(names), key=key)]


@dataclass(frozen=True)
class Method:
    """A named way of choosing kept tokens: ``scorer`` scores once, ``selector(rate)`` selects per rate.

    ``scorer`` is None for `llmlingua`, which selects by itself (see `specprefill_sdk.eval.llmlingua`).
    ``policy`` is set for a policy method: its selector decides the keep share, so ``selector``
    ignores the rate and the method runs once per sample.
    """

    name: str
    description: str
    scorer_key: str
    scorer: Scorer | None
    selector: Callable[[float], Selector]
    uses_draft: bool
    policy: Policy | None = None


def _protect(inner: Any) -> Selector:
    from ..selection import Protect

    return Protect(inner, sink=1, tail=True)


def build_methods(
    names: Sequence[str],
    *,
    draft: LoadedModel | None,
    seed: int = 0,
    target_tokenizer: Any = None,
    target: LoadedModel | None = None,
) -> list[Method]:
    """Build the named methods; draft-based ones share the loaded ``draft``.

    ``target``: the loaded target model, which ``target-early-N[-AGG]`` methods score with (the
    harness passes the one it generates with; no second copy is loaded). Without such methods it is
    not used.

    Raises:
        InvalidRequestError: an unknown method name, a draft-based method without a draft, or a
            ``target-early-*`` method without a target.
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
            f"unknown method(s) {', '.join(unknown)}; choose from {', '.join(METHOD_DESCRIPTIONS)}, "
            f"draft-early-N[-AGG], target-early-N[-AGG] (AGG: {', '.join(EARLY_AGGREGATIONS)}) "
            "or policy:NAME (a preset or .toml file that loads)",
            param="methods",
        )
    policies = {n: _load(n) for n in names if policy_of(n) is not None}
    needs_draft = [n for n in names if n.startswith("draft-") or n in ("self-info", "llmlingua")]
    needs_draft += [n for n, p in policies.items() if p is not None and p.scorer.kind in MODEL_SCORERS]
    if needs_draft and draft is None:
        raise InvalidRequestError(f"methods {', '.join(needs_draft)} need a draft model", param="draft")
    needs_target = [n for n in names if n.startswith("target-")]
    if needs_target and target is None:
        raise InvalidRequestError(f"methods {', '.join(needs_target)} need the target model", param="target")

    base: DraftAttentionScorer | None = None
    if any(n.startswith("draft-") for n in names) or any(
        p is not None and p.scorer.kind == "draft-attention" for p in policies.values()
    ):
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

    target_base: DraftAttentionScorer | None = None
    if needs_target:
        assert target is not None
        target_base = DraftAttentionScorer(target, look_ahead=1, pool_kernel=13, target_tokenizer=target_tokenizer)

    def early(name: str) -> Method:
        parsed = _early(name)
        model, layers, aggregation = parsed if parsed else ("draft", 0, cast("Aggregation", "max"))
        on = base if model == "draft" else target_base
        assert on is not None
        depth = on.depth
        layers = layers or max(1, depth // 2)  # plain draft-early: half of the draft's layers
        if layers > depth:
            raise InvalidRequestError(f"{name}: the {model} has {depth} layers", param="methods")
        scorer = on.with_options(look_ahead=1, layers=layers, aggregation=aggregation)
        # the aggregation changes the scores, so each one is a scoring pass of its own
        key = f"{model}-la1-pool13-layers{layers}" + ("" if aggregation == "max" else f"-{aggregation}")
        return Method(name, str(method_description(name)), key, scorer, chunked, model == "draft")

    out: list[Method] = []
    for name in names:
        desc = str(method_description(name))
        policy = policies.get(name)
        if policy is not None:
            out.append(_policy_method(name, desc, policy, base, draft, target_tokenizer))
        elif name == "draft-early" or _EARLY.fullmatch(name):
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
        elif name == "draft-chunked-qmax":
            assert base is not None
            scorer = base.with_options(queries="max")
            out.append(Method(name, desc, "draft-la8-pool13-qmax", scorer, chunked, True))
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


def _policy_scorer_key(policy: Policy, name: str) -> str:
    """The ``scorer_key`` of a policy's scorer: a draft-attention one shares the fixed methods' keys
    (``draft-la8-pool13`` for the paper's settings), so the same settings score once per sample."""
    s = policy.scorer
    if s.kind != "draft-attention":
        return f"{name}:{s.kind}"
    key = f"draft-la{s.look_ahead}-pool{s.pool_kernel}"
    if s.layers is not None:
        key += f"-layers{s.layers}"
    if s.layer_share is not None:
        key += f"-share{s.layer_share:g}"
    if s.aggregation != "max":
        key += f"-{s.aggregation}"
    if s.queries != "mean":
        key += f"-q{s.queries}"
    return key


def _policy_method(
    name: str, desc: str, policy: Policy, base: Any, draft: LoadedModel | None, target_tokenizer: Any
) -> Method:
    """The method of ``policy``: its scorer built on the loaded draft (a variant of ``base``, the
    shared draft-attention scorer, when it is one) and its own selector, at whatever rate it is asked."""
    s = policy.scorer
    scorer: Scorer
    if s.kind == "draft-attention":
        assert base is not None
        if s.layers is not None and s.layers > base.depth:
            raise InvalidRequestError(f"{name}: the draft has {base.depth} layers", param="methods")
        scorer = draft_variant(s, base)
    elif s.kind in MODEL_SCORERS:
        assert draft is not None
        scorer = policy.build_scorer(draft, target_tokenizer=target_tokenizer)
    else:
        scorer = policy.build_scorer()
    selector = policy.build_selector()

    def chosen(_rate: float) -> Selector:
        return selector

    return Method(name, desc, _policy_scorer_key(policy, name), scorer, chosen, s.kind in MODEL_SCORERS, policy)
