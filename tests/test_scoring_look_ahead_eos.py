"""Look-ahead stops at an end-of-sequence id on every path of the draft: the fixed buffers of
global-attention drafts and the layer-by-layer path of windowed drafts (Gemma-3 style), alone and in
a batch where only one row stops."""

from __future__ import annotations

import pytest
from test_scoring_draft import _WithEos, assert_matches
from tiny_models import tiny_model

from specprefill_sdk.eval.corpora import haystack
from specprefill_sdk.prompt import build_prompt
from specprefill_sdk.scoring import DraftAttentionScorer
from specprefill_sdk.scoring.draft_attention import greedy_look_ahead, reference_draft_attention_scores

pytestmark = pytest.mark.slow

KINDS = ["qwen2", "gemma3", "gemma3-sliding"]  # fixed buffers; windowed layers beside global ones; all windowed


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("stop_at", [0, 2])
def test_look_ahead_ends_before_an_end_of_sequence_id(tokenizer, kind: str, stop_at: int) -> None:
    loaded = tiny_model(kind, tokenizer)
    prompt = build_prompt(tokenizer, haystack(120, start=3))
    free = greedy_look_ahead(_WithEos(**vars(loaded)), prompt.token_ids, 8)
    assert len(free) == 7
    stop = free[stop_at]
    first = free.index(stop)  # the first time the stop id comes up
    with_eos = _WithEos(**vars(loaded), eos=(stop,))
    scores = DraftAttentionScorer(with_eos).score(prompt)
    assert scores.info["look_ahead"] == 1 + first, kind
    assert scores.info["look_ahead_token_ids"] == tuple(free[:first])
    expected, continuation = reference_draft_attention_scores(with_eos, prompt.token_ids, look_ahead=8)
    assert continuation == free[:first]
    assert_matches(scores.values, expected)
    # The same as asking for that many queries of a draft without an end-of-sequence id.
    assert_matches(DraftAttentionScorer(loaded, look_ahead=1 + first).score(prompt).values, scores.values)


@pytest.mark.parametrize("kind", KINDS)
def test_in_a_batch_only_the_row_that_meets_its_end_stops(tokenizer, kind: str) -> None:
    loaded = tiny_model(kind, tokenizer)
    prompts = [build_prompt(tokenizer, haystack(120, start=3)), build_prompt(tokenizer, haystack(90, start=11))]
    free = [greedy_look_ahead(_WithEos(**vars(loaded)), p.token_ids, 8) for p in prompts]
    stops = [t for t in free[0][1:4] if t not in free[1]]
    if not stops:
        pytest.skip("the two rows' look-ahead tokens overlap; no id ends only the first")
    stop = stops[0]
    with_eos = _WithEos(**vars(loaded), eos=(stop,))
    scorer = DraftAttentionScorer(with_eos)
    batch = scorer.score_batch(prompts)
    assert [s.info["look_ahead"] for s in batch] == [1 + free[0].index(stop), 8]
    for prompt, scores in zip(prompts, batch, strict=True):
        single = scorer.score(prompt)
        assert scores.info["look_ahead_token_ids"] == single.info["look_ahead_token_ids"]
        assert_matches(scores.values, single.values)
