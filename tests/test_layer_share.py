"""``layer_share``: the first layers of the draft as a share of its depth, in the scorer, policies and requests."""

from __future__ import annotations

import pytest
import torch

from specprefill_sdk.errors import InvalidRequestError, PolicyError
from specprefill_sdk.policies import Policy, draft_variant, load_policy
from specprefill_sdk.prompt import build_prompt
from specprefill_sdk.scoring import DraftAttentionScorer


@pytest.fixture(scope="module")
def scorer(smollm):
    return DraftAttentionScorer(smollm, look_ahead=1)


def _share_policy(share: float = 0.67, **scorer: object) -> Policy:
    return Policy.from_dict(
        {"name": "shallow", "scorer": {"look_ahead": 1, "layer_share": share, **scorer}, "selector": {"keep_rate": 0.2}}
    )


@pytest.mark.parametrize(("share", "layers"), [(0.67, 20), (0.5, 15), (0.01, 1), (1.0, None)])
def test_a_share_scores_with_its_rounded_number_of_layers(smollm, share, layers) -> None:
    depth = smollm.model.config.num_hidden_layers  # 30
    shared = DraftAttentionScorer(smollm, look_ahead=1, layer_share=share)
    assert shared.layers == layers  # None: every layer
    assert shared.layers_of_share(share) == (layers or depth)


def test_a_share_gives_the_same_scores_as_its_layer_count(smollm, essay) -> None:
    prompt = build_prompt(smollm.tokenizer, [{"role": "user", "content": essay[:2500] + "\nWhat is this about?"}])
    by_share = DraftAttentionScorer(smollm, look_ahead=1, layer_share=0.4, aggregation="last-layer")
    by_count = DraftAttentionScorer(smollm, look_ahead=1, layers=12, aggregation="last-layer")
    full = DraftAttentionScorer(smollm, look_ahead=1, aggregation="last-layer")
    assert by_share.layers == 12 and by_share.last_layer == by_count.last_layer == 11
    a, b = by_share.score(prompt).values, by_count.score(prompt).values
    assert torch.equal(a, b)
    assert not torch.equal(a, full.score(prompt).values)  # another layer votes at full depth


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"look_ahead": 1, "layer_share": 0.0}, "layer_share"),
        ({"look_ahead": 1, "layer_share": 1.5}, "layer_share"),
        ({"look_ahead": 1, "layer_share": True}, "layer_share"),
        ({"look_ahead": 1, "layer_share": 0.5, "layers": 4}, "layer_share"),
        ({"look_ahead": 8, "layer_share": 0.5}, "layers"),
    ],
)
def test_the_scorer_refuses_a_bad_share(smollm, kwargs, param) -> None:
    with pytest.raises(InvalidRequestError) as info:
        DraftAttentionScorer(smollm, **kwargs)
    assert info.value.param == param


def test_policy_settings_check_the_share() -> None:
    assert _share_policy().scorer.layer_share == 0.67
    assert "first 0.67 of the draft's layers" in _share_policy().summary()
    for bad in ({"layer_share": 0}, {"layer_share": 2}, {"layer_share": 0.5, "layers": 3}):
        with pytest.raises(PolicyError):
            _share_policy(**bad)  # type: ignore[arg-type]
    with pytest.raises(PolicyError, match="needs look_ahead = 1"):
        Policy.from_dict({"name": "x", "scorer": {"look_ahead": 8, "layer_share": 0.5}})


def test_overrides_replace_one_depth_setting_with_the_other() -> None:
    policy = _share_policy()
    by_count = policy.with_overrides(layers=6)
    assert (by_count.scorer.layers, by_count.scorer.layer_share) == (6, None)
    back = by_count.with_overrides(layer_share=0.5)
    assert (back.scorer.layers, back.scorer.layer_share) == (None, 0.5)
    with pytest.raises(PolicyError, match="not both"):
        policy.with_overrides(layers=6, layer_share=0.5)
    # look-ahead tokens need the whole draft: a longer look-ahead asks for every layer
    whole = policy.with_overrides(look_ahead=8)
    assert (whole.scorer.look_ahead, whole.scorer.layers, whole.scorer.layer_share) == (8, None, None)
    with pytest.raises(PolicyError):
        policy.with_overrides(look_ahead=8, layer_share=0.5)
    assert policy.with_overrides(look_ahead=1).scorer.layer_share == 0.67


def test_a_policy_with_a_share_shares_the_loaded_draft(smollm, scorer) -> None:
    built = _share_policy().build_scorer(smollm)
    assert isinstance(built, DraftAttentionScorer) and built.layers == 20
    variant = draft_variant(_share_policy().scorer, scorer)
    assert variant is not scorer and variant.loaded is smollm and variant.layers == 20
    assert draft_variant(_share_policy().scorer, variant) is variant  # already those knobs
    assert draft_variant(load_policy("paper").scorer, variant).layers is None  # every layer again


def test_the_auto_shallow_preset_scores_as_shipped(smollm, scorer) -> None:
    # what `--policy auto-shallow` builds on the embedded draft: two thirds of its 30 layers, the deepest voting
    policy = load_policy("auto-shallow")
    built = policy.build_scorer(smollm)
    assert isinstance(built, DraftAttentionScorer)
    assert (built.layers, built.look_ahead, built.aggregation, built.last_layer) == (20, 1, "last-layer", 19)
    variant = draft_variant(policy.scorer, scorer)
    assert variant.loaded is smollm and (variant.layers, variant.aggregation) == (20, "last-layer")
    assert policy.selector.kind == "adaptive" and policy.selector.coverage == 0.95
