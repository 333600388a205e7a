"""The draft-attention reduction on a tensor small enough to compute by hand.

The reference implementation (`scoring/draft_attention/reference.py`) and the fast scorer could be
changed the same wrong way and still agree; these expected numbers come from the formula as
docs/scoring.md states it, worked out below, not from either implementation:

    s_i = mean_j  max_{l,h}  pool(softmax_i(q_{l,h,j} . k_{l,i} * scaling))[i]

with ``pool`` a moving average of 3 tokens that averages over the tokens that exist (the first and
last columns average two values, not three with a zero).

The set-up: 2 layers, 2 query heads sharing 1 kv head (GQA), head dim 1, 3 queries (the last prompt
token and two look-ahead tokens), 6 prompt keys. Each key is ``ln(w_i)``, each query ``e / scaling``,
so a query's logits are ``e * ln(w_i)`` and its softmax is ``w_i^e / sum(w^e)``: with ``e = 1`` the
row is ``w / sum(w)``, with ``e = 0`` it is uniform. Both layers' weights sum to 12:

    w (layer 0) = [6, 1, 1, 1, 1, 2]      softmax, e=1: [6, 1, 1, 1, 1, 2] / 12
    w (layer 1) = [1, 1, 1, 1, 4, 4]      softmax, e=1: [1, 1, 1, 1, 4, 4] / 12
                                          softmax, e=0: [2, 2, 2, 2, 2, 2] / 12

Pooled (kernel 3, in twelfths):
    layer 0, e=1: [(6+1)/2, (6+1+1)/3, (1+1+1)/3, (1+1+1)/3, (1+1+2)/3, (1+2)/2] = [7/2, 8/3, 1, 1, 4/3, 3/2]
    layer 1, e=1: [(1+1)/2, 3/3, 3/3, (1+1+4)/3, (1+4+4)/3, (4+4)/2]           = [1, 1, 1, 2, 3, 4]
    uniform:      [2, 2, 2, 2, 2, 2]

The exponents ``e`` per layer, head and query (``E[l][h][j]``):
    layer 0: head 0 [1, 0, 1], head 1 [0, 0, 0]
    layer 1: head 0 [0, 1, 0], head 1 [0, 0, 1]

Max over layers and heads, per query (twelfths):
    j=0: max(layer 0 e=1, uniform)              = [7/2, 8/3, 2, 2, 2, 2]
    j=1: max(layer 1 e=1, uniform)              = [2, 2, 2, 2, 3, 4]
    j=2: max(layer 0 e=1, layer 1 e=1, uniform) = [7/2, 8/3, 2, 2, 3, 4]

Mean over the 3 queries (twelfths): [3, 22/9, 2, 2, 8/3, 10/3], i.e. the scores below.
Any other order changes them: pooling after the max gives [4, 10/3, ...] for query 0; a pool that
counts the missing neighbour as zero gives 7/3 at column 0; the sum over queries triples them.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from specprefill_sdk.scoring.draft_attention.hook import ScoreCollector, pool_rows

WEIGHTS = ([6.0, 1.0, 1.0, 1.0, 1.0, 2.0], [1.0, 1.0, 1.0, 1.0, 4.0, 4.0])
EXPONENTS = (((1, 0, 1), (0, 0, 0)), ((0, 1, 0), (0, 0, 1)))  # [layer][head][query]
SCALING = 0.5
PROMPT, QUERIES, LAYERS, HEADS = 6, 3, 2, 2

#: per query, max over layers and heads, in twelfths (worked out in the module docstring)
EXPECTED_MAX = (
    (7 / 2, 8 / 3, 2, 2, 2, 2),
    (2, 2, 2, 2, 3, 4),
    (7 / 2, 8 / 3, 2, 2, 3, 4),
)
#: the token scores: mean over the queries, in twelfths
EXPECTED_SCORES = (3, 22 / 9, 2, 2, 8 / 3, 10 / 3)


def _keys(layer: int) -> torch.Tensor:
    """``[B=1, KVH=1, 6, d=1]``: ``ln(w_i)``."""
    return torch.tensor([math.log(w) for w in WEIGHTS[layer]], dtype=torch.float32).view(1, 1, PROMPT, 1)


def _query(layer: int, j: int, scaling: float = SCALING) -> torch.Tensor:
    """``[B=1, H=2, d=1]``: ``e / scaling`` per head."""
    return torch.tensor([EXPONENTS[layer][h][j] / scaling for h in range(HEADS)], dtype=torch.float32).view(1, HEADS, 1)


def _with_look_ahead(keys: torch.Tensor, step: int) -> torch.Tensor:
    """The keys an attention call of look-ahead step ``step`` sees: the prompt's, then ``step`` more.

    Only the prompt's keys count; the look-ahead keys are large so that counting them would show.
    """
    more = torch.full((keys.shape[0], keys.shape[1], step, keys.shape[3]), 5.0)
    return torch.cat([keys, more], dim=2)


def _collector(pad: tuple[int, ...] = (0,), width: int = PROMPT) -> ScoreCollector:
    return ScoreCollector(
        pad=torch.tensor(pad),
        prompt_len=width,
        num_queries=QUERIES,
        pool_kernel=3,
        skip=frozenset(),
        device=torch.device("cpu"),
    )


def _expected(rows: tuple[tuple[float, ...], ...]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32) / 12


def test_the_pool_averages_over_existing_neighbours_only() -> None:
    row = torch.tensor([6.0, 1, 1, 1, 1, 2]).view(1, 1, PROMPT)
    pooled = pool_rows(row, torch.ones(1, 1, PROMPT, dtype=torch.bool), 3)
    assert pooled.flatten().tolist() == pytest.approx([7 / 2, 8 / 3, 1, 1, 4 / 3, 3 / 2])


def test_layer_by_layer_reduction_matches_the_hand_computed_scores() -> None:
    collector = _collector()
    for j in range(QUERIES):
        collector.begin_step(j)
        for layer in range(LAYERS):
            keys = _with_look_ahead(_keys(layer), j)
            query = _query(layer, j).view(1, HEADS, 1, 1)
            collector.observe(SimpleNamespace(layer_idx=layer), query, keys, keys, SCALING, None, None)
    assert torch.allclose(collector.best[0], _expected(EXPECTED_MAX), atol=1e-6)
    # The scorer's last step: the mean over the queries it used.
    assert torch.allclose(collector.best[0].mean(dim=0), _expected((EXPECTED_SCORES,))[0], atol=1e-6)


@pytest.mark.parametrize("scalings", [(SCALING, SCALING), (SCALING, 0.25)], ids=["one-scaling", "per-layer"])
def test_stacked_reduction_matches_the_hand_computed_scores(scalings: tuple[float, float]) -> None:
    collector = _collector()
    # [L, B, H, J, d]: each layer's query pre-divided by its own scaling, so the logits stay e * ln(w).
    queries = torch.stack(
        [torch.stack([_query(layer, j, scalings[layer]) for j in range(QUERIES)], dim=2) for layer in range(LAYERS)]
    )
    keys = torch.stack([_keys(layer) for layer in range(LAYERS)])
    collector.observe_stacked(queries, keys, list(scalings))
    assert torch.allclose(collector.best[0], _expected(EXPECTED_MAX), atol=1e-6)
    assert torch.allclose(collector.best[0].mean(dim=0), _expected((EXPECTED_SCORES,))[0], atol=1e-6)


def test_a_left_padded_row_scores_as_it_would_alone() -> None:
    # Row 1 of a batch is left-padded by one column: its keys start at column 1, the pad column gets
    # no attention and is not averaged into the pool of column 1 (the scorer drops the pad column).
    collector = _collector(pad=(0, 1), width=PROMPT + 1)
    pad_key = torch.full((1, 1, 1, 1), 3.0)
    for j in range(QUERIES):
        collector.begin_step(j)
        for layer in range(LAYERS):
            alone = _keys(layer)
            keys = _with_look_ahead(
                torch.cat([torch.cat([alone, pad_key], dim=2), torch.cat([pad_key, alone], dim=2)]), j
            )
            query = torch.cat([_query(layer, j), _query(layer, j)]).view(2, HEADS, 1, 1)
            collector.observe(SimpleNamespace(layer_idx=layer), query, keys, keys, SCALING, None, None)
    assert torch.allclose(collector.best[1, :, 1:], _expected(EXPECTED_MAX), atol=1e-6)


def test_skipped_layers_do_not_count() -> None:
    # Without layer 1 the maximum of query 1 is the uniform row alone.
    collector = ScoreCollector(
        pad=torch.tensor([0]),
        prompt_len=PROMPT,
        num_queries=QUERIES,
        pool_kernel=3,
        skip=frozenset({1}),
        device=torch.device("cpu"),
    )
    for j in range(QUERIES):
        collector.begin_step(j)
        for layer in range(LAYERS):
            collector.observe(
                SimpleNamespace(layer_idx=layer),
                _query(layer, j).view(1, HEADS, 1, 1),
                _with_look_ahead(_keys(layer), j),
                _with_look_ahead(_keys(layer), j),
                SCALING,
                None,
                None,
            )
    assert torch.allclose(collector.best[0, 1], torch.full((PROMPT,), 2 / 12), atol=1e-6)


# ----------------------------------------------------------------------------- windowed layers
#: Layer 0's weights, one head with e = 1, a window of 3 tokens. The query of step j sits at sequence
#: index 5 + j and sees the prompt keys i with (5 + j) - i < 3; the softmax runs over those only:
#:   step 0: keys 3, 4, 5 -> [0, 0, 0, 1/4, 1/4, 1/2] -> pooled [0, 0, 1/12, 1/6, 1/3, 3/8]
#:   step 1: keys 4, 5    -> [0, 0, 0, 0, 1/3, 2/3]   -> pooled [0, 0, 0, 1/9, 1/3, 1/2]
#:   step 2: key 5        -> [0, 0, 0, 0, 0, 1]       -> pooled [0, 0, 0, 0, 1/3, 1/2]
WINDOW = 3
EXPECTED_WINDOWED = (
    (0, 0, 1 / 12, 1 / 6, 1 / 3, 3 / 8),
    (0, 0, 0, 1 / 9, 1 / 3, 1 / 2),
    (0, 0, 0, 0, 1 / 3, 1 / 2),
)


@pytest.mark.parametrize("cached", [None, WINDOW + 2, WINDOW], ids=["every-key", "cache-of-5", "sliding-cache"])
def test_a_windowed_layer_attends_within_its_window_only(cached: int | None) -> None:
    # `cached`: the call sees only the last `cached` keys of the sequence (a sliding cache drops the
    # oldest), so at step 2 a single prompt key is left in view; None: every key, masked by the window.
    collector = ScoreCollector(
        pad=torch.tensor([0]),
        prompt_len=PROMPT,
        num_queries=QUERIES,
        pool_kernel=3,
        skip=frozenset(),
        device=torch.device("cpu"),
    )
    for j in range(QUERIES):
        collector.begin_step(j)
        keys = _with_look_ahead(_keys(0), j)
        if cached is not None:
            keys = keys[:, :, -cached:]
        query = torch.tensor([1 / SCALING]).view(1, 1, 1, 1)
        if j == 0:  # the prompt's prefill passes every prompt query; the last one is the scoring query
            query = torch.cat([torch.full((1, 1, PROMPT - 1, 1), -7.0), query], dim=2)
        collector.observe(SimpleNamespace(layer_idx=0), query, keys, keys, SCALING, WINDOW, None)
    assert torch.allclose(collector.best[0], torch.tensor(EXPECTED_WINDOWED), atol=1e-6)


def test_the_prefill_call_scores_with_its_last_query_row() -> None:
    # Step 0 of a real draft passes every prompt position's query; earlier rows must not count.
    collector = _collector()
    collector.begin_step(0)
    for layer in range(LAYERS):
        last = _query(layer, 0).view(1, HEADS, 1, 1)
        earlier = torch.full((1, HEADS, PROMPT - 1, 1), 9.0)
        collector.observe(
            SimpleNamespace(layer_idx=layer), torch.cat([earlier, last], dim=2), _keys(layer), _keys(layer),
            SCALING, None, None,
        )  # fmt: skip
    assert torch.allclose(collector.best[0, 0], _expected(EXPECTED_MAX)[0], atol=1e-6)


@pytest.mark.parametrize("group_elements", [1, 10**9], ids=["one-layer-per-group", "one-group"])
def test_stacked_reduction_in_groups_and_around_a_skipped_layer(group_elements: int) -> None:
    # Three layers, the middle one skipped (a windowed layer beside global ones): what counts are
    # layers 0 and 2, which carry the two layers above, so the hand-computed scores still hold whether
    # the layers are reduced one group each or all in one (a non-contiguous group).
    collector = ScoreCollector(
        pad=torch.tensor([0]),
        prompt_len=PROMPT,
        num_queries=QUERIES,
        pool_kernel=3,
        skip=frozenset({1}),
        device=torch.device("cpu"),
    )
    collector.group_elements = group_elements
    per_layer = [torch.stack([_query(layer, j) for j in range(QUERIES)], dim=2) for layer in range(LAYERS)]
    noise = torch.full_like(per_layer[0], 4.0)  # the skipped layer would dominate every maximum
    queries = torch.stack([per_layer[0], noise, per_layer[1]])
    keys = torch.stack([_keys(0), _keys(0), _keys(1)])
    collector.observe_stacked(queries, keys, [SCALING] * 3)
    assert torch.allclose(collector.best[0], _expected(EXPECTED_MAX), atol=1e-6)
    assert collector.layers_seen == {0, 2}


def test_stacked_reduction_of_a_left_padded_batch() -> None:
    # The batch of the layer-by-layer padding test, reduced all at once: row 1's pad column is hidden.
    collector = _collector(pad=(0, 1), width=PROMPT + 1)
    pad_key = torch.full((1, 1, 1, 1), 3.0)
    keys = torch.stack(
        [
            torch.cat([torch.cat([_keys(layer), pad_key], dim=2), torch.cat([pad_key, _keys(layer)], dim=2)])
            for layer in range(LAYERS)
        ]
    )  # [L, B=2, KVH=1, 7, d]
    per_layer = [torch.stack([_query(layer, j) for j in range(QUERIES)], dim=2) for layer in range(LAYERS)]
    queries = torch.stack([torch.cat([q, q]) for q in per_layer])  # [L, B=2, H, J, d]
    collector.observe_stacked(queries, keys, [SCALING] * LAYERS)
    assert torch.allclose(collector.best[1, :, 1:], _expected(EXPECTED_MAX), atol=1e-6)
