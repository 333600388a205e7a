"""DraftSession: the draft's cache kept across turns scores like a fresh DraftAttentionScorer."""

from __future__ import annotations

import pytest
import torch

from specprefill_sdk.prompt import build_prompt
from specprefill_sdk.scoring import DraftAttentionScorer
from specprefill_sdk.scoring.draft_attention import DraftSession

pytestmark = pytest.mark.slow


def test_session_scores_equal_full_scoring_and_prefill_only_new_tokens(smollm, essay) -> None:
    scorer = DraftAttentionScorer(smollm, look_ahead=4)
    session = DraftSession(scorer)
    tok = smollm.tokenizer
    turn1 = [{"role": "user", "content": essay[:900] + "\n\nWhat is this about?"}]
    turn2 = [
        *turn1,
        {"role": "assistant", "content": "It is about work."},
        {"role": "user", "content": "Which city is mentioned?"},
    ]
    p1, p2 = build_prompt(tok, turn1), build_prompt(tok, turn2)
    common = 0
    while common < p1.n and p1.token_ids[common] == p2.token_ids[common]:
        common += 1

    s1 = session.score(p1)
    assert session.last_prefilled == p1.n and session.cached_tokens == p1.n
    s2 = session.score(p2)
    assert session.last_prefilled == p2.n - common < p2.n / 4
    assert session.cached_tokens == p2.n  # the look-ahead tokens were dropped again
    for mine, prompt in ((s1, p1), (s2, p2)):
        full = scorer.score(prompt)
        assert mine.values.shape == full.values.shape
        assert torch.allclose(mine.values, full.values, atol=2e-3, rtol=0)
        assert torch.equal(mine.values.topk(20).indices.sort().values, full.values.topk(20).indices.sort().values)
        assert mine.info["look_ahead"] == full.info["look_ahead"]
    # Scoring the same prompt again re-runs only its last token.
    session.score(p2)
    assert session.last_prefilled == 1
    # Going back to a shorter history crops the cache to the common prefix.
    session.score(p1)
    assert session.last_prefilled == 1 and session.cached_tokens == p1.n
    session.reset()
    session.score(p1)
    assert session.last_prefilled == p1.n


def test_a_session_with_the_first_layers_only_caches_those_and_scores_like_the_scorer(smollm, essay) -> None:
    scorer = DraftAttentionScorer(smollm, look_ahead=1, layers=10)
    session = DraftSession(scorer)
    tok = smollm.tokenizer
    turn1 = [{"role": "user", "content": essay[:700] + "\n\nWhat is this about?"}]
    turn2 = [*turn1, {"role": "assistant", "content": "Work."}, {"role": "user", "content": "And the city?"}]
    for messages in (turn1, turn2):
        prompt = build_prompt(tok, messages)
        mine = session.score(prompt)
        full = scorer.score(prompt)
        assert torch.allclose(mine.values, full.values, atol=2e-3, rtol=0)
        assert torch.equal(mine.values.topk(20).indices.sort().values, full.values.topk(20).indices.sort().values)
        # only the first 10 layers ran, so only they hold the conversation
        cache = session._cache
        assert len(cache.layers) == 10 and cache.get_seq_length() == session.cached_tokens == prompt.n
    assert session.last_prefilled < build_prompt(tok, turn2).n / 4


def test_a_sessions_passes_run_under_the_scorers_attention_kernels(smollm, essay, monkeypatch) -> None:
    """Every forward of a session, the new turn's and the look-ahead steps', runs inside `sdpa_context`."""
    import contextlib

    from specprefill_sdk.scoring.draft_attention import incremental

    scorer = DraftAttentionScorer(smollm, look_ahead=3)
    entered: list[tuple[object, object]] = []

    @contextlib.contextmanager
    def recording_context(names, device):
        entered.append((names, device))
        yield

    monkeypatch.setattr(incremental, "sdpa_context", recording_context)
    session = DraftSession(scorer)
    scores = session.score(build_prompt(smollm.tokenizer, essay[:600] + "\n\nWhat is this about?"))
    assert scores.info["look_ahead"] == 3
    # the prompt but its last token, the last token (its queries observed), then the two further look-ahead
    # steps: each pass with the scorer's kernels on its device
    assert entered == [(scorer.execution.attention_backends, smollm.device)] * 4
