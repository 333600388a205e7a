"""Request options reach the stages the server builds, and a pre-compressed request decodes where it should.

Each field of the ``specprefill`` request extension that overrides the policy is set to a value no
shipped policy uses, and the pipeline `ServingEngine.pipeline_for` builds for it is inspected: the
value must sit on the scorer or selector actually built, not only on the validated options. A new
override field without an expectation here fails `test_every_override_field_has_an_expectation`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from specprefill_sdk.scoring import DraftAttentionScorer
from specprefill_sdk.selection import Adaptive, Chunked, DenseBelow, KeepRate, Protect, StructuredChunks, TokenBudget
from specprefill_sdk.server.engine import ServingEngine
from specprefill_sdk.server.schemas import SpecPrefillOptions
from specprefill_sdk.types import CompressedPrompt

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def engine(smollm: Any) -> Iterator[ServingEngine]:
    from specprefill_sdk.backends import TransformersBackend
    from specprefill_sdk.server import ServerConfig

    config = ServerConfig(policy="paper")
    served = ServingEngine(TransformersBackend(smollm), DraftAttentionScorer(smollm), config=config)
    yield served
    served.shutdown()


def _stages(selector: Any) -> list[Any]:
    """The selector and every selector it wraps, outermost first."""
    out = []
    while selector is not None:
        out.append(selector)
        selector = getattr(selector, "inner", None)
    return out


def _one(selector: Any, kind: type) -> Any:
    found = [s for s in _stages(selector) if isinstance(s, kind)]
    assert len(found) == 1, f"{kind.__name__} in {selector.name}"
    return found[0]


# field -> (request options, policy, check on (scorer, selector)); values differ from every shipped policy's
Check = Callable[[Any, Any], bool]
EXPECTED: dict[str, tuple[dict[str, Any], str, Check]] = {
    "keep_rate": ({"keep_rate": 0.37}, "paper", lambda sc, sel: _one(sel, KeepRate).rate == 0.37),
    "token_budget": ({"token_budget": 77}, "paper", lambda sc, sel: _one(sel, TokenBudget).k == 77),
    "chunk_size": ({"chunk_size": 7}, "paper", lambda sc, sel: _one(sel, Chunked).size == 7),
    "look_ahead": ({"look_ahead": 3}, "paper", lambda sc, sel: sc.look_ahead == 3),
    "pool_kernel": ({"pool_kernel": 5}, "paper", lambda sc, sel: sc.pool_kernel == 5),
    "layers": ({"layers": 2, "look_ahead": 1}, "paper", lambda sc, sel: sc.layers == 2 and sc.look_ahead == 1),
    "layer_share": (
        {"layer_share": 0.1, "look_ahead": 1},
        "paper",
        lambda sc, sel: sc.layers == sc.layers_of_share(0.1) and sc.look_ahead == 1,
    ),
    "aggregation": ({"aggregation": "mean"}, "paper", lambda sc, sel: sc.aggregation == "mean"),
    "min_prompt_tokens": ({"min_prompt_tokens": 123}, "paper", lambda sc, sel: _one(sel, DenseBelow).tokens == 123),
    "sink": ({"sink": 3}, "paper", lambda sc, sel: _one(sel, Protect).sink == 3),
    "tail": ({"tail": False}, "paper", lambda sc, sel: _one(sel, Protect).tail is False),
    "roles": ({"roles": ["system", "tool"]}, "paper", lambda sc, sel: _one(sel, Protect).roles == ("system", "tool")),
    "last_user_turn": ({"last_user_turn": True}, "paper", lambda sc, sel: _one(sel, Protect).last_user_turn is True),
    "special_tokens": ({"special_tokens": True}, "paper", lambda sc, sel: _one(sel, Protect).special_tokens is True),
}

#: Fields of the extension that are not policy overrides, and what they do instead.
NOT_OVERRIDES = {
    "enabled",  # dense prefill, no draft (test_disabled_requests_never_run_the_draft)
    "policy",  # which preset the overrides apply to
    "prompt_token_ids",  # pre-compressed prompts (test_a_precompressed_prompt_...)
    "position_ids",
    "prompt_length",
    "return_token_ids",
    "return_kept_positions",  # what the answer's usage carries (test_the_kept_positions_are_the_selection_...)
    "conversation_id",
    "conversation_start",
    "conversation_strategy",
}


def test_every_override_field_has_an_expectation() -> None:
    every = {**{k: v for opts, _, _ in EXPECTED.values() for k, v in opts.items()}}
    every.pop("token_budget")  # keep_rate and token_budget are exclusive; both are listed above
    every.pop("layer_share")  # so are layers and layer_share
    assert set(SpecPrefillOptions(**every).overrides()) | {"token_budget", "layer_share"} == set(EXPECTED)
    assert set(SpecPrefillOptions(token_budget=5).overrides()) == {"token_budget"}
    assert set(SpecPrefillOptions(layer_share=0.5).overrides()) == {"layer_share"}
    # Every field of the extension is either an override or listed as something else.
    assert set(SpecPrefillOptions.model_fields) == set(EXPECTED) | NOT_OVERRIDES


@pytest.mark.parametrize("field", list(EXPECTED))
def test_each_override_reaches_the_built_scorer_or_selector(engine: ServingEngine, field: str) -> None:
    options, policy, check = EXPECTED[field]
    pipe = engine.pipeline_for(SpecPrefillOptions(policy=policy, **options))
    assert check(pipe.scorer, pipe.selector), (field, pipe.scorer.name, pipe.selector.name)
    # The policy's own pipeline is not it (the override changed something).
    default = engine.pipeline_for(SpecPrefillOptions(policy=policy))
    try:
        holds = check(default.scorer, default.selector)
    except AssertionError:  # the policy's own pipeline lacks that stage altogether
        holds = False
    assert not holds, field


def test_overrides_of_the_auto_policy_reach_its_selector(engine: ServingEngine) -> None:
    pipe = engine.pipeline_for(SpecPrefillOptions(policy="auto", min_prompt_tokens=77, chunk_size=9, sink=2))
    assert _one(pipe.selector, Adaptive).dense_below_tokens == 77
    # a chunk size asked for replaces auto's text chunks with fixed ones of that size
    assert _one(pipe.selector, Chunked).size == 9 and _one(pipe.selector, Protect).sink == 2
    assert not [s for s in _stages(pipe.selector) if isinstance(s, StructuredChunks)]
    assert not [s for s in _stages(pipe.selector) if isinstance(s, DenseBelow)]  # the switch is Adaptive's own


def test_scorer_overrides_share_the_loaded_draft(engine: ServingEngine) -> None:
    base = engine.pipeline_for(None).scorer
    variant = engine.pipeline_for(SpecPrefillOptions(look_ahead=2, pool_kernel=3)).scorer
    assert isinstance(variant, DraftAttentionScorer) and variant is not base
    assert variant.loaded is base.loaded and (variant.look_ahead, variant.pool_kernel) == (2, 3)
    # Options equal to the policy's build no variant: the process's scorer serves as it is.
    assert engine.pipeline_for(SpecPrefillOptions(look_ahead=8, pool_kernel=13)).scorer is base


def test_disabled_requests_never_run_the_draft(engine: ServingEngine) -> None:
    pipe = engine.pipeline_for(SpecPrefillOptions(enabled=False, keep_rate=0.2))
    assert isinstance(pipe.selector, KeepRate) and pipe.selector.rate == 1.0


# ----------------------------------------------------------------------------- pre-compressed prompts
def test_a_precompressed_prompt_without_its_length_decodes_after_its_last_position(engine: ServingEngine) -> None:
    ids = list(engine.backend.tokenizer("The capital of France is Paris. The capital of Italy is")["input_ids"])
    keep = [0, 1, 2, 3, 5, 6, 8, len(ids) - 3, len(ids) - 2, len(ids) - 1]
    kept_ids, positions = [ids[i] for i in keep], keep
    bare = engine.prepare(None, SpecPrefillOptions(prompt_token_ids=kept_ids, position_ids=positions), {})
    assert bare.compressed is not None
    assert bare.compressed.n == len(ids)  # the last position + 1, not the count of kept tokens
    assert bare.compressed.position_ids == tuple(positions)
    # The target decodes the first new token at position n.
    assert engine.backend.prefill(bare.compressed).next_position == len(ids)
    named = engine.prepare(
        None, SpecPrefillOptions(prompt_token_ids=kept_ids, position_ids=positions, prompt_length=len(ids)), {}
    )
    assert named.compressed == bare.compressed
    longer = engine.prepare(
        None, SpecPrefillOptions(prompt_token_ids=kept_ids, position_ids=positions, prompt_length=len(ids) + 9), {}
    )
    assert longer.compressed is not None and longer.compressed.n == len(ids) + 9
    assert engine.backend.prefill(longer.compressed).next_position == len(ids) + 9
    # The default max_tokens is what the context leaves after n (within the server's caps), not after
    # the kept count.
    expected = engine.max_context - len(ids)
    for cap in (engine.default_max_tokens, engine.max_output_tokens):
        expected = expected if cap is None else min(expected, cap)
    assert bare.params.max_tokens == expected
    short = engine.prepare(
        None, SpecPrefillOptions(prompt_token_ids=kept_ids, position_ids=positions), {"max_tokens": 4}
    )
    completion = engine.run_generate(short)
    assert completion.usage.prompt_tokens == len(ids) and completion.usage.kept_tokens == len(keep)
    same = engine.backend.generate(CompressedPrompt(tuple(kept_ids), tuple(positions), len(ids)), short.params)
    assert completion.token_ids == same.token_ids


def test_the_earlier_adaptive_name_serves_the_auto_pipeline(engine: ServingEngine) -> None:
    auto = engine.pipeline_for(SpecPrefillOptions(policy="auto", chunk_size=9))
    with pytest.warns(DeprecationWarning, match="replaced by 'auto'"):
        old = engine.pipeline_for(SpecPrefillOptions(policy="adaptive", chunk_size=9))
    assert old is auto  # one cached pipeline for both names
    assert "adaptive" not in engine.policies and "auto" in engine.policies
