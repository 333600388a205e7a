"""Policy presets: loading by name and path, validation errors, overrides, the selectors they build."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from specprefill_sdk.errors import PolicyError
from specprefill_sdk.policies import (
    DEFAULT_DENSE_BELOW_TOKENS,
    OVERRIDE_KEYS,
    Policy,
    list_policies,
    load_policy,
    policy_dirs,
)
from specprefill_sdk.selection import Adaptive, Chunked, DenseBelow, KeepRate, Protect, StructuredChunks, TokenBudget
from specprefill_sdk.types import Prompt

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

POLICY_DIR = Path(__file__).resolve().parents[1] / "policies"


def test_shipped_presets_are_listed_and_parse() -> None:
    names = list_policies()
    assert {"paper", "conservative", "auto", "dense"} <= set(names)
    assert "adaptive" not in names  # an earlier name, still loaded (as auto), no longer listed
    assert names == sorted(p.stem for p in POLICY_DIR.glob("*.toml"))
    for name in names:
        policy = load_policy(name)
        assert policy.name == name
        assert policy.description
        assert policy.build_selector().name


def test_every_file_in_policies_is_a_valid_policy() -> None:
    for path in POLICY_DIR.glob("*.toml"):
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        Policy.from_dict({"name": path.stem, **data}, source=path.name)


def test_paper_preset_has_the_paper_settings() -> None:
    paper = load_policy("paper")
    assert paper.scorer.kind == "draft-attention"
    assert (paper.scorer.look_ahead, paper.scorer.pool_kernel) == (8, 13)
    assert (paper.selector.kind, paper.selector.keep_rate, paper.selector.chunk_size) == ("keep-rate", 0.1, 32)
    assert paper.selector.dense_below_tokens == DEFAULT_DENSE_BELOW_TOKENS > 0  # short prompts: dense
    assert paper.build_selector() == DenseBelow(
        Protect(Chunked(KeepRate(0.1), 32), sink=1, tail=True), DEFAULT_DENSE_BELOW_TOKENS
    )


def _auto_toml() -> dict[str, Any]:
    """policies/auto.toml as written (its numbers are calibrated, so tests read them rather than repeat them)."""
    return tomllib.loads((POLICY_DIR / "auto.toml").read_text(encoding="utf-8"))


def test_conservative_and_auto_presets() -> None:
    conservative = load_policy("conservative")
    assert conservative.selector.keep_rate == 0.3
    selector = conservative.build_selector()
    assert isinstance(selector, DenseBelow) and selector.tokens == DEFAULT_DENSE_BELOW_TOKENS
    selector = selector.inner
    assert isinstance(selector, Protect) and selector.roles == ("system",) and not selector.last_user_turn
    written = _auto_toml()["selector"]
    auto = load_policy("auto").build_selector()
    # text chunks, with fixed windows of chunk_size for prompts without text
    assert written["chunking"] == "text"
    assert isinstance(auto, Protect) and isinstance(auto.inner, StructuredChunks)
    assert auto.inner.fallback_size == written["chunk_size"]
    inner = auto.inner.inner
    assert isinstance(inner, Adaptive) and inner.dense_below_tokens == written["dense_below_tokens"] > 0
    assert (inner.coverage, inner.min_rate, inner.max_rate, inner.min_tokens) == (
        written["coverage"],
        written["min_rate"],
        written["max_rate"],
        written["min_tokens"],
    )
    below = written["dense_below_tokens"]
    assert auto.decide_without_scores(Prompt.from_token_ids(range(below - 1))) is not None
    assert auto.decide_without_scores(Prompt.from_token_ids(range(below))) is None


def test_auto_is_the_default_policy() -> None:
    import inspect

    from specprefill_sdk import Pipeline
    from specprefill_sdk.components import PipelineSettings
    from specprefill_sdk.policies import DEFAULT_POLICY, load_pipeline
    from specprefill_sdk.server import ServerConfig

    assert DEFAULT_POLICY == "auto" and DEFAULT_POLICY in list_policies()
    assert inspect.signature(load_pipeline).parameters["policy"].default == DEFAULT_POLICY
    assert inspect.signature(Pipeline.from_policy).parameters["policy"].default == DEFAULT_POLICY
    assert ServerConfig().policy == DEFAULT_POLICY
    assert PipelineSettings.model_fields["policy"].default == DEFAULT_POLICY


def test_the_adaptive_name_loads_auto_with_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from specprefill_sdk import policies

    policies._WARNED.discard("adaptive")
    with caplog.at_level(logging.WARNING, logger="specprefill_sdk.policies"):
        with pytest.warns(DeprecationWarning, match="'adaptive' was replaced by 'auto'.*fewer tokens than the paper"):
            old = load_policy("adaptive")
        with pytest.warns(DeprecationWarning):
            again = load_policy("adaptive")
    assert old == again == load_policy("auto") and old.name == "auto"
    logged = [r for r in caplog.records if "'adaptive' was replaced by 'auto'" in r.getMessage()]
    assert len(logged) == 1 and logged[0].levelno == logging.WARNING  # once per process, not per request
    assert "adaptive" not in list_policies() and "adaptive" in policies.DEPRECATED_PRESETS


def test_dense_preset_never_needs_scores() -> None:
    selector = load_policy("dense").build_selector()
    decided = selector.decide_without_scores(Prompt.from_token_ids(range(5000)))
    assert decided is not None and decided.dense and decided.kept == 5000


def test_presets_are_found_in_the_checkout() -> None:
    assert any(Path(str(d)) == POLICY_DIR for d in policy_dirs())


def test_load_by_path(tmp_path: Path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text('description = "token budget"\n[selector]\nkind = "token-budget"\ntoken_budget = 256\n')
    for spec in (path, str(path)):
        policy = load_policy(spec)
        assert policy.name == "mine"
        # a file that names no dense_below_tokens gets the default, as the presets do
        assert policy.build_selector() == DenseBelow(Protect(Chunked(TokenBudget(256), 32)), DEFAULT_DENSE_BELOW_TOKENS)


def test_unknown_name_lists_the_valid_policies() -> None:
    with pytest.raises(PolicyError) as info:
        load_policy("papr")
    message = str(info.value)
    assert "'papr'" in message
    for name in list_policies():
        assert name in message


def test_unknown_field_lists_the_valid_fields(tmp_path: Path) -> None:
    path = tmp_path / "typo.toml"
    path.write_text("[selector]\nkeeprate = 0.2\n")
    with pytest.raises(PolicyError) as info:
        load_policy(path)
    message = str(info.value)
    assert "selector.keeprate" in message
    assert "keep_rate" in message and "chunk_size" in message and "dense_below_tokens" in message
    path.write_text("[selecter]\nkeep_rate = 0.2\n")
    with pytest.raises(PolicyError, match="valid fields: name, description, scorer, selector, protect"):
        load_policy(path)


@pytest.mark.parametrize(
    ("toml", "match"),
    [
        ("[selector]\nkeep_rate = 1.5\n", "selector.keep_rate"),
        ("[selector]\nkeep_rate = '0.1'\n", "valid number"),
        ("[selector]\nkind = 'top-k'\n", "'keep-rate', 'token-budget' or 'adaptive'"),
        ("[selector]\nkind = 'token-budget'\n", "needs token_budget"),
        ("[selector]\nmin_rate = 0.6\n", "must not exceed max_rate"),
        ("[scorer]\nlook_ahead = 0\n", "scorer.look_ahead"),
        ("[protect]\ntail = -1\n", "tail must be"),
        ("[protect]\nsink = true\n", "protect.sink"),
        ("[selector\nkeep_rate = 0.1\n", "not valid TOML"),
    ],
)
def test_bad_values_give_policy_errors(tmp_path: Path, toml: str, match: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(toml)
    with pytest.raises(PolicyError, match=match):
        load_policy(path)


def test_missing_file_is_a_policy_error(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="not found"):
        load_policy(tmp_path / "absent.toml")


def test_overrides_change_a_copy() -> None:
    paper = load_policy("paper")
    changed = paper.with_overrides(keep_rate=0.25, chunk_size=16, look_ahead=4, sink=2, roles=["system"])
    assert (changed.selector.keep_rate, changed.selector.chunk_size) == (0.25, 16)
    assert changed.scorer.look_ahead == 4
    assert changed.protect.sink == 2 and changed.protect.roles == ("system",)
    assert paper.selector.keep_rate == 0.1 and paper.protect.sink == 1
    assert changed.build_selector() == DenseBelow(
        Protect(Chunked(KeepRate(0.25), 16), sink=2, roles=("system",)), DEFAULT_DENSE_BELOW_TOKENS
    )


def test_overrides_of_none_are_ignored_and_all_keys_are_accepted() -> None:
    paper = load_policy("paper")
    assert paper.with_overrides(keep_rate=None, chunk_size=None) == paper
    values = {
        "keep_rate": 0.2,
        "chunk_size": 8,
        "look_ahead": 1,
        "pool_kernel": 5,
        "layers": 6,
        "aggregation": "mean",
        "dense_below_tokens": 64,
        "sink": 0,
        "tail": 4,
        "roles": ("system",),
        "last_user_turn": True,
        "special_tokens": True,
        "coverage": 0.8,
        "min_rate": 0.1,
        "max_rate": 0.3,
        "min_tokens": 256,
    }
    changed = paper.with_overrides(**values)
    for key, value in values.items():
        section = getattr(
            changed,
            {"look_ahead": "scorer", "pool_kernel": "scorer", "layers": "scorer", "aggregation": "scorer"}.get(
                key, "selector"
            ),
        )
        if not hasattr(section, key):
            section = changed.protect
        assert getattr(section, key) == value, key
    # token_budget and layer_share replace keep_rate and layers (tests/test_layer_share.py)
    assert set(values) | {"token_budget", "layer_share"} == set(OVERRIDE_KEYS)


def test_keep_rate_and_token_budget_overrides_switch_the_selector_kind() -> None:
    auto = load_policy("auto")
    fixed = auto.with_overrides(keep_rate=0.2)
    assert fixed.selector.kind == "keep-rate"
    budget = auto.with_overrides(token_budget=300)
    assert budget.selector.kind == "token-budget"
    built = budget.build_selector()
    assert isinstance(built, DenseBelow) and built.tokens == _auto_toml()["selector"]["dense_below_tokens"]
    with pytest.raises(PolicyError, match="not both"):
        auto.with_overrides(keep_rate=0.2, token_budget=300)


def test_a_chunk_size_override_switches_text_chunks_to_fixed_ones_of_that_size() -> None:
    auto = load_policy("auto")
    assert auto.selector.chunking == "text"
    nine = auto.with_overrides(chunk_size=9)
    assert nine.selector.chunking == "fixed" and nine.selector.min_chunk_size is None
    built = nine.build_selector()
    assert isinstance(built, Protect) and isinstance(built.inner, Chunked) and built.inner.size == 9
    # single tokens, which text chunks refuse in a policy file, are what the request asked for
    single = auto.with_overrides(chunk_size=1).build_selector()
    assert isinstance(single, Protect) and isinstance(single.inner, Adaptive)
    # other overrides keep the text chunks
    rate = auto.with_overrides(keep_rate=0.2).build_selector()
    assert isinstance(rate, DenseBelow) and isinstance(rate.inner, Protect)
    assert isinstance(rate.inner.inner, StructuredChunks) and isinstance(rate.inner.inner.inner, KeepRate)


def test_unknown_override_lists_the_valid_keys() -> None:
    with pytest.raises(PolicyError) as info:
        load_policy("paper").with_overrides(keeprate=0.2)
    assert info.value.param == "keeprate"
    for key in OVERRIDE_KEYS:
        assert key in str(info.value)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("keep_rate", 0),
        ("keep_rate", 1.01),
        ("keep_rate", "0.5"),
        ("chunk_size", 0),
        ("chunk_size", True),
        ("look_ahead", 0),
        ("layers", 0),
        ("layers", 4),  # with the preset's look-ahead 8
        ("tail", -3),
        ("token_budget", 0),
        ("roles", [1]),
    ],
)
def test_bad_override_values_name_the_key(key: str, value: object) -> None:
    with pytest.raises(PolicyError) as info:
        load_policy("paper").with_overrides(**{key: value})
    assert info.value.param == key
    assert key in str(info.value)


def test_selector_shapes() -> None:
    paper = load_policy("paper")
    paper = paper.with_overrides(dense_below_tokens=0)  # asked for: compress prompts of any length
    assert paper.with_overrides(chunk_size=1).build_selector() == Protect(KeepRate(0.1))
    assert paper.with_overrides(sink=0, tail=False).build_selector() == Chunked(KeepRate(0.1), 32)
    assert paper.build_selector().decide_without_scores(Prompt.from_token_ids(range(100))) is None
    dense_below = paper.with_overrides(min_prompt_tokens=512).build_selector()
    assert dense_below == DenseBelow(Protect(Chunked(KeepRate(0.1), 32)), 512)
    assert dense_below.decide_without_scores(Prompt.from_token_ids(range(100))) is not None


def test_keep_rate_one_skips_the_draft() -> None:
    selector = load_policy("paper").with_overrides(keep_rate=1.0).build_selector()
    assert selector.decide_without_scores(Prompt.from_token_ids(range(3000))) is not None


def test_policy_objects_are_immutable() -> None:
    paper = load_policy("paper")
    with pytest.raises(Exception):  # noqa: B017 - pydantic raises ValidationError for frozen models
        paper.selector.keep_rate = 0.5  # type: ignore[misc]


@pytest.mark.slow
def test_load_pipeline_shares_the_target_as_draft_and_generates(smollm, essay) -> None:
    from specprefill_sdk.pipeline import Pipeline
    from specprefill_sdk.policies import load_pipeline

    pipe = load_pipeline("paper", model=smollm, keep_rate=0.2)
    assert pipe.backend.loaded is smollm  # type: ignore[attr-defined]
    assert pipe.scorer.loaded is smollm  # type: ignore[attr-defined]
    assert pipe.selector == DenseBelow(Protect(Chunked(KeepRate(0.2), 32)), DEFAULT_DENSE_BELOW_TOKENS)
    prompt = [{"role": "user", "content": essay[:2000] + "\n\nIn one sentence, what is this text about?"}]
    answer = pipe.generate(prompt, max_tokens=4)
    assert answer.usage.completion_tokens >= 1
    assert 0.15 < answer.usage.keep_ratio < 0.35
    assert answer.draft == pipe.draft_name and answer.timings.score > 0

    dense = Pipeline.from_policy("dense", model=smollm)
    full = dense.generate(prompt, max_tokens=4)
    assert full.usage.kept_tokens == full.usage.prompt_tokens
    assert full.timings.score == 0.0


@pytest.mark.slow
def test_load_pipeline_and_the_server_pass_compile_to_the_backend_and_the_draft_scorer(smollm) -> None:
    from specprefill_sdk.policies import load_pipeline, scorer_for
    from specprefill_sdk.runtime import ExecutionSettings
    from specprefill_sdk.server import ServerConfig, create_app

    pipe = load_pipeline("paper", model=smollm, execution=ExecutionSettings(compile=True))
    assert pipe.backend.execution.compile and pipe.scorer.execution.compile  # type: ignore[attr-defined]
    assert not load_pipeline("paper", model=smollm).scorer.execution.compile  # type: ignore[attr-defined]
    app = create_app(ServerConfig(model="smollm2-135m", device="cpu", dtype="auto", compile=True))
    engine = app.state.engine
    assert engine.backend.execution.compile and engine._base_scorer.execution.compile
    per_request = scorer_for(load_policy("paper").with_overrides(look_ahead=2), engine._base_scorer, engine.backend)
    assert per_request.execution.compile  # per-request scorers too


def test_resolve_pipeline_passes_a_pipeline_through_and_refuses_other_objects() -> None:
    from specprefill_sdk import InvalidRequestError
    from specprefill_sdk.policies import resolve_pipeline

    with pytest.raises(InvalidRequestError, match=r"must be a specprefill_sdk\.Pipeline"):
        resolve_pipeline(3, policy="paper", model="smollm2-135m")


def test_override_selector_sets_the_budget_of_a_policy():
    from specprefill_sdk.policies import override_selector

    assert override_selector("paper") is None  # no budget given: the pipeline's own selector applies
    selector = override_selector("paper", keep_rate=0.2)
    assert selector is not None and "KeepRate(0.2)" in selector.name
    budget = override_selector("paper", {"chunk_size": 1}, token_budget=64)
    assert budget is not None and "TokenBudget(64)" in budget.name and "Chunked" not in budget.name


# ------------------------------------------------------------------------- registries and building
def test_the_registries_name_every_kind_and_resolve_to_its_class() -> None:
    from typing import get_args

    from specprefill_sdk import scoring, selection
    from specprefill_sdk.policies import (
        SCORERS,
        SELECTORS,
        ScorerSettings,
        SelectorSettings,
        scorer_class,
        selector_class,
    )

    assert set(SCORERS) == set(get_args(ScorerSettings.model_fields["kind"].annotation))
    assert set(SELECTORS) == set(get_args(SelectorSettings.model_fields["kind"].annotation))
    for kind in SCORERS:
        assert scorer_class(kind).name == kind  # a scorer's name is its kind
    assert scorer_class("draft-attention") is scoring.DraftAttentionScorer
    assert selector_class("keep-rate") is selection.KeepRate and selector_class("adaptive") is selection.Adaptive
    with pytest.raises(PolicyError, match="unknown scorer kind 'magic'; valid kinds: draft-attention"):
        scorer_class("magic")
    with pytest.raises(PolicyError, match="unknown selector kind"):
        selector_class("magic")


def test_scorer_for_builds_baselines_and_needs_a_loaded_draft_otherwise() -> None:
    from types import SimpleNamespace

    from specprefill_sdk.policies import scorer_for
    from specprefill_sdk.scoring import RandomScorer

    backend = SimpleNamespace(model_name="target", tokenizer=None)
    random = Policy.from_dict({"name": "r", "scorer": {"kind": "random", "seed": 3}})
    built = scorer_for(random, None, backend)  # type: ignore[arg-type]
    assert isinstance(built, RandomScorer)
    with pytest.raises(PolicyError, match="scores with a draft model"):
        scorer_for(load_policy("paper"), None, backend)  # type: ignore[arg-type]


def test_scorer_for_reuses_the_loaded_draft_and_varies_only_its_knobs(smollm) -> None:
    from specprefill_sdk.backends import TransformersBackend
    from specprefill_sdk.policies import build_pipeline, scorer_for
    from specprefill_sdk.scoring import DraftAttentionScorer, SelfInformationScorer

    backend = TransformersBackend(smollm)
    loaded = DraftAttentionScorer(smollm, target_tokenizer=backend.tokenizer)
    paper = load_policy("paper")
    assert scorer_for(paper, loaded, backend) is loaded
    variant = scorer_for(paper.with_overrides(look_ahead=1, layers=4), loaded, backend)
    assert isinstance(variant, DraftAttentionScorer) and variant is not loaded
    assert variant.loaded is smollm and (variant.look_ahead, variant.layers) == (1, 4)
    other = scorer_for(Policy.from_dict({"name": "s", "scorer": {"kind": "self-information"}}), loaded, backend)
    assert isinstance(other, SelfInformationScorer) and other.loaded is smollm

    off = build_pipeline(None, loaded, backend)
    assert off.selector == KeepRate(1.0) and off.scorer is loaded and off.draft_name == loaded.model_name
    served = build_pipeline(paper, loaded, backend)
    assert served.scorer is loaded and served.selector == paper.build_selector()


def test_the_dense_below_switch_has_one_name_and_still_reads_its_earlier_one(tmp_path: Path) -> None:
    paper = load_policy("paper")
    assert paper.with_overrides(dense_below_tokens=512) == paper.with_overrides(min_prompt_tokens=512)
    assert paper.with_overrides(min_prompt_tokens=512).selector.dense_below_tokens == 512
    assert load_policy("auto").selector.dense_below_tokens == _auto_toml()["selector"]["dense_below_tokens"]
    path = tmp_path / "old.toml"
    path.write_text("[selector]\nmin_prompt_tokens = 64\n")
    assert load_policy(path).selector.dense_below_tokens == 64
    path.write_text("[selector]\nmin_prompt_tokens = 64\ndense_below_tokens = 64\n")
    with pytest.raises(PolicyError, match=r"selector\.dense_below_tokens or its earlier name min_prompt_tokens"):
        load_policy(path)
    with pytest.raises(PolicyError, match="not both"):
        paper.with_overrides(min_prompt_tokens=1, dense_below_tokens=1)


def test_load_pipeline_refuses_execution_settings_nothing_built_reads(smollm) -> None:
    from specprefill_sdk import ExecutionSettings, InvalidRequestError
    from specprefill_sdk.backends import TransformersBackend
    from specprefill_sdk.policies import load_pipeline
    from specprefill_sdk.scoring import RecencyScorer

    backend = TransformersBackend(smollm)
    execution = ExecutionSettings(compile=True)
    with pytest.raises(InvalidRequestError, match="both the backend and the scorer are given") as info:
        load_pipeline("paper", backend=backend, scorer=RecencyScorer(), execution=execution)
    assert info.value.param == "execution"
    # a draft-attention scorer built here takes it
    pipe = load_pipeline("paper", backend=backend, execution=execution)
    assert pipe.scorer.execution is execution  # type: ignore[attr-defined]


def test_the_presets_prefill_short_prompts_whole_unless_asked_otherwise() -> None:
    n = DEFAULT_DENSE_BELOW_TOKENS
    for name in ("paper", "conservative"):
        policy = load_policy(name)
        selector = policy.build_selector()
        short = selector.decide_without_scores(Prompt.from_token_ids(range(48)))
        assert short is not None and short.dense and short.kept == 48 and short.reason == f"dense below {n} tokens"
        assert selector.decide_without_scores(Prompt.from_token_ids(range(n))) is None  # long: scored
        assert f"dense below {n} tokens" in policy.summary()
        # an explicit keep rate keeps the threshold; an explicit dense_below_tokens=0 turns it off
        kept = policy.with_overrides(keep_rate=0.2).build_selector()
        assert kept.decide_without_scores(Prompt.from_token_ids(range(48))) is not None
        off = policy.with_overrides(dense_below_tokens=0).build_selector()
        assert not isinstance(off, DenseBelow) and off.decide_without_scores(Prompt.from_token_ids(range(48))) is None
    auto_below = load_policy("auto").selector.dense_below_tokens
    assert auto_below == _auto_toml()["selector"]["dense_below_tokens"] != n  # its own threshold
    assert not isinstance(load_policy("dense").build_selector(), DenseBelow)  # dense already
