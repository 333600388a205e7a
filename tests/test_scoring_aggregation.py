"""The ``aggregation`` option of draft-attention scoring: the reduction by hand, and how it reaches the scorer.

Hand-computed example (one query, two layers of one head, keys ``ln(w)`` and a query of 1 with
scaling 1, so each row is ``w / sum(w)``; no pooling)::

    layer 0: w = [4, 1, 1, 2, 2, 2]  -> [4, 1, 1, 2, 2, 2] / 12
    layer 1: w = [2, 1, 3, 4, 1, 1]  -> [2, 1, 3, 4, 1, 1] / 12

    max:   [4, 1, 3, 4, 2, 2] / 12
    mean:  [6, 2, 4, 6, 3, 3] / 24
    content-mean: a 6-token prompt keeps columns 1..3 (column 0 is the sink; the local window is
    min(256, (6 - 1) // 2) = 2 tokens), each row renormalised over them:
        layer 0: [0, 1, 1, 2, 0, 0] / 4,  layer 1: [0, 1, 3, 4, 0, 0] / 8
        mean:    [0, 3, 5, 8, 0, 0] / 16
    last-layer: layer 1 alone (the deepest scored), the mean over its one head: [2, 1, 3, 4, 1, 1] / 12

Queries (``queries``): two queries whose reduced rows are [4, 1, 3, 4, 2, 2] / 12 (query 0, max
aggregation above) and [2, 1, 3, 4, 1, 1] / 12 (query 1, layer 1 only) give
    mean: [6, 2, 6, 8, 3, 3] / 24,  max: [4, 1, 3, 4, 2, 2] / 12
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from specprefill_sdk.errors import InvalidRequestError, PolicyError
from specprefill_sdk.policies import Policy, load_policy
from specprefill_sdk.prompt import build_prompt
from specprefill_sdk.scoring.draft_attention.hook import ScoreCollector, content_columns

WEIGHTS = ([4.0, 1.0, 1.0, 2.0, 2.0, 2.0], [2.0, 1.0, 3.0, 4.0, 1.0, 1.0])
EXPECTED = {
    "max": [4 / 12, 1 / 12, 3 / 12, 4 / 12, 2 / 12, 2 / 12],
    "mean": [6 / 24, 2 / 24, 4 / 24, 6 / 24, 3 / 24, 3 / 24],
    "content-mean": [0.0, 3 / 16, 5 / 16, 8 / 16, 0.0, 0.0],
    "last-layer": [2 / 12, 1 / 12, 3 / 12, 4 / 12, 1 / 12, 1 / 12],
}


def _keys(layer: int, pad: int = 0) -> torch.Tensor:
    logs = [0.0] * pad + [math.log(w) for w in WEIGHTS[layer]]
    return torch.tensor(logs, dtype=torch.float32).view(1, 1, len(logs), 1)


def _collector(
    aggregation: str, pad: tuple[int, ...] = (0,), width: int = 6, queries: int = 1, reduction: str = "mean"
) -> ScoreCollector:
    return ScoreCollector(
        pad=torch.tensor(pad),
        prompt_len=width,
        num_queries=queries,
        pool_kernel=1,
        skip=frozenset(),
        device=torch.device("cpu"),
        aggregation=aggregation,  # type: ignore[arg-type]
        last_layer=1 if aggregation == "last-layer" else None,
        queries=reduction,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("aggregation", list(EXPECTED))
def test_layer_by_layer_reduction_matches_the_hand_computed_scores(aggregation: str) -> None:
    collector = _collector(aggregation)
    collector.begin_step(0)
    for layer in range(2):
        query = torch.ones(1, 1, 1, 1)
        collector.observe(SimpleNamespace(layer_idx=layer), query, _keys(layer), _keys(layer), 1.0, None, None)
    assert collector.reduced[0, 0].tolist() == pytest.approx(EXPECTED[aggregation], abs=1e-6)


@pytest.mark.parametrize("aggregation", list(EXPECTED))
def test_stacked_reduction_matches_the_hand_computed_scores(aggregation: str) -> None:
    collector = _collector(aggregation)
    queries = torch.ones(2, 1, 1, 1, 1)  # [L, B, H, J, d]
    keys = torch.stack([_keys(0), _keys(1)])  # [L, B, KVH, P, d]
    collector.observe_stacked(queries, keys, [1.0, 1.0])
    assert collector.reduced[0, 0].tolist() == pytest.approx(EXPECTED[aggregation], abs=1e-6)


def test_a_left_padded_row_leaves_out_its_own_sink_and_window() -> None:
    assert content_columns(torch.tensor([0, 2]), 8)[:, 0].tolist() == [
        [False, True, True, True, True, False, False, False],  # 8 tokens: window 3
        [False, False, False, True, True, True, False, False],  # 6 tokens from column 2: window 2
    ]
    collector = _collector("content-mean", pad=(2,), width=8)
    queries = torch.ones(2, 1, 1, 1, 1)
    keys = torch.stack([_keys(0, pad=2), _keys(1, pad=2)])
    collector.observe_stacked(queries, keys, [1.0, 1.0])
    assert collector.reduced[0, 0, 2:].tolist() == pytest.approx(EXPECTED["content-mean"], abs=1e-6)


def test_the_aggregation_reaches_the_scorer_from_a_policy_and_overrides(smollm) -> None:
    from specprefill_sdk.backends import TransformersBackend
    from specprefill_sdk.policies import scorer_for
    from specprefill_sdk.scoring import DraftAttentionScorer
    from specprefill_sdk.server.schemas import SpecPrefillOptions

    backend = TransformersBackend(smollm)
    loaded = DraftAttentionScorer(smollm, target_tokenizer=backend.tokenizer)
    assert loaded.aggregation == "max"
    paper = load_policy("paper")
    overrides = SpecPrefillOptions(aggregation="content-mean", look_ahead=1, layers=4).overrides()
    assert overrides == {"aggregation": "content-mean", "look_ahead": 1, "layers": 4}
    variant = scorer_for(paper.with_overrides(**overrides), loaded, backend)
    assert isinstance(variant, DraftAttentionScorer) and variant.loaded is smollm
    assert (variant.aggregation, variant.layers) == ("content-mean", 4)
    built = Policy.from_dict({"name": "s", "scorer": {"aggregation": "mean"}}).build_scorer(smollm)
    assert isinstance(built, DraftAttentionScorer) and built.aggregation == "mean"
    prompt = build_prompt(smollm.tokenizer, "The key is 4711. " * 40 + "What is the key?")
    scores = variant.with_options(pool_kernel=1).score(prompt)
    assert scores.info["aggregation"] == "content-mean"
    # unpooled, the sink and the local window score nothing; the rest shares the attention
    assert float(scores.values[0]) == 0.0 and float(scores.values[-1]) == 0.0
    assert float(scores.values[1 : prompt.n // 2].sum()) > 0
    with pytest.raises(PolicyError):
        paper.with_overrides(aggregation="median")
    with pytest.raises(InvalidRequestError) as err:
        loaded.with_options(aggregation="median")  # type: ignore[arg-type]
    assert err.value.param == "aggregation"


@pytest.mark.parametrize(
    ("reduction", "expected"),
    [("mean", [6 / 24, 2 / 24, 6 / 24, 8 / 24, 3 / 24, 3 / 24]), ("max", EXPECTED["max"])],
)
def test_the_queries_are_combined_by_their_mean_or_their_max(reduction: str, expected: list[float]) -> None:
    collector = _collector("max", queries=2, reduction=reduction)
    for step, layers in ((0, (0, 1)), (1, (1,))):
        collector.begin_step(step)
        for layer in layers:
            query = torch.ones(1, 1, 1, 1)
            # at step j the cache also holds the j look-ahead tokens (not scored)
            keys = torch.cat([_keys(layer), torch.zeros(1, 1, step, 1)], dim=2)
            collector.observe(SimpleNamespace(layer_idx=layer), query, keys, keys, 1.0, None, None)
    assert collector.token_scores(0, 2).tolist() == pytest.approx(expected, abs=1e-6)
    assert collector.token_scores(0, 1).tolist() == pytest.approx(EXPECTED["max"], abs=1e-6)  # one query


def test_last_layer_needs_its_layer_and_only_it() -> None:
    with pytest.raises(ValueError, match="last_layer"):
        ScoreCollector(
            pad=torch.tensor([0]),
            prompt_len=6,
            num_queries=1,
            pool_kernel=1,
            skip=frozenset(),
            device=torch.device("cpu"),
            aggregation="last-layer",
        )


def test_policies_read_the_query_reduction_and_the_last_layer_aggregation(smollm, tmp_path) -> None:
    from specprefill_sdk.scoring import DraftAttentionScorer

    path = tmp_path / "qmax.toml"
    path.write_text(
        'name = "qmax"\n[scorer]\nqueries = "max"\nlook_ahead = 1\nlayers = 6\naggregation = "last-layer"\n'
    )
    policy = load_policy(path)
    assert (policy.scorer.queries, policy.scorer.aggregation) == ("max", "last-layer")
    assert "queries max" in policy.summary() and "aggregation last-layer" in policy.summary()
    built = policy.build_scorer(smollm)
    assert isinstance(built, DraftAttentionScorer)
    assert (built.queries, built.aggregation, built.layers, built.last_layer) == ("max", "last-layer", 6, 5)
    assert "queries='max'" in repr(built) and "aggregation='last-layer'" in repr(built)
    assert load_policy("paper").scorer.queries == "mean"
    for bad in ({"queries": "median"}, {"aggregation": "first-layer"}, {"queries": 1}):
        with pytest.raises(PolicyError):
            Policy.from_dict({"name": "bad", "scorer": bad})


def test_bad_query_reductions_are_refused(smollm) -> None:
    from specprefill_sdk.scoring import DraftAttentionScorer

    scorer = DraftAttentionScorer(smollm, look_ahead=2)
    for bad in ("median", "MAX", None, 1):
        with pytest.raises(InvalidRequestError, match="queries must be one of mean, max") as err:
            DraftAttentionScorer(smollm, queries=bad)  # type: ignore[arg-type]
        assert err.value.param == "queries"
    with pytest.raises(InvalidRequestError) as err:
        scorer.with_options(queries="sum")  # type: ignore[arg-type]
    assert err.value.param == "queries"
    variant = scorer.with_options(queries="max")
    assert variant.queries == "max" and variant.loaded is smollm and scorer.queries == "mean"
    assert variant.with_options(look_ahead=3).queries == "max"  # kept unless given
