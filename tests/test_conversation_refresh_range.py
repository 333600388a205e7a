"""Which cached tokens a ``refresh`` turn prefills again, counted exactly.

A scorer that names the positions to keep on each call and a selector that keeps exactly those make
both turns' selections known in advance. Turn 1 keeps ``A``; turn 2 keeps ``B``, which drops some of
``A`` (``gone``) and brings back some positions turn 1 dropped (``inserted``). Every cached token after
the first change was computed without that change, so ``refresh`` prefills it again; only cached
tokens before ``first = min(inserted + gone)`` are reused. Tokens kept between the first and the last
change tell a range that starts at the first change from one that starts at the last.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import torch

from specprefill_sdk import Pipeline
from specprefill_sdk.types import Prompt, Selection, TokenScores

pytestmark = pytest.mark.slow

A = {*range(0, 12), *range(20, 30)}  # turn 1 (plus its last token)
GONE = set(range(5, 10))  # kept in turn 1, dropped in turn 2
INSERTED = {14, 15}  # dropped in turn 1, kept in turn 2
BETWEEN = {10, 11}  # cached, kept in both turns, between the first change (5) and the last (15)
REUSED = set(range(0, 5))  # cached and before the first change: the only tokens reused


class NamedPositions:
    """Scores 1 for the positions listed for this call, 0 elsewhere; later calls add every new token."""

    name = "named-positions"

    def __init__(self) -> None:
        self.calls: list[int] = []

    def _wanted(self, prompt: Prompt) -> set[int]:
        if not self.calls:
            return set(A)
        first_n = self.calls[0]
        return ((A - GONE) | INSERTED) | set(range(first_n, prompt.n))

    def score(self, prompt: Prompt) -> TokenScores:
        wanted = self._wanted(prompt)
        self.calls.append(prompt.n)
        values = torch.tensor([1.0 if i in wanted else 0.0 for i in range(prompt.n)])
        return TokenScores(values, scorer=self.name)

    def score_batch(self, prompts: Sequence[Prompt]) -> list[TokenScores]:
        return [self.score(p) for p in prompts]


class KeepScored:
    """Keeps the tokens scored above zero, and the last one (its logits start the answer)."""

    name = "keep-scored"

    def decide_without_scores(self, prompt: Prompt) -> Selection | None:
        return None

    def select(self, prompt: Prompt, scores: TokenScores) -> Selection:
        keep = sorted({i for i, v in enumerate(scores.values.tolist()) if v > 0} | {prompt.n - 1})
        return Selection(tuple(keep), prompt.n, (False,) * len(keep), requested_rate=None)


def _two_turns(smollm: Any, **options: Any) -> tuple[Any, Any, Any]:
    from specprefill_sdk.backends import TransformersBackend

    pipe = Pipeline(NamedPositions(), KeepScored(), TransformersBackend(smollm))
    conv = pipe.conversation(strategy="refresh", system="You answer briefly.", **options)
    first = conv.send("Name a colour. " * 8, max_tokens=3)
    second = conv.send("And another one?", max_tokens=3)
    return conv, first, second


def test_refresh_prefills_again_every_cached_token_after_the_first_change(smollm: Any) -> None:
    conv, first, second = _two_turns(smollm)
    n1 = conv.turns[0].prompt_tokens
    assert set(first.selection.indices) == A | {n1 - 1}
    kept = set(second.selection.indices)
    assert kept >= INSERTED | BETWEEN | REUSED and not GONE & kept
    stats = conv.turns[-1]
    # Reused: the cached tokens before position 5 only; the kept ones at 10, 11 and 20..29 were cached
    # too but lie after the first change, so they are prefilled again.
    assert stats.reused_tokens == len(REUSED), stats
    assert stats.prefilled_tokens == len(kept) - len(REUSED)
    assert stats.kept_tokens == len(kept)
    assert sorted(int(p) for p in conv.state.positions[0].tolist() if p < stats.prompt_tokens) == sorted(kept)


def test_refresh_without_recompute_stale_reuses_every_cached_token_it_keeps(smollm: Any) -> None:
    conv, _, second = _two_turns(smollm, recompute_stale=False)
    stats = conv.turns[-1]
    n1 = conv.turns[0].prompt_tokens
    cached_and_kept = {p for p in second.selection.indices if p in A and p < n1 - 1}
    assert cached_and_kept == REUSED | BETWEEN | set(range(20, 30))
    # Tokens from turn 1's answer on are cached as well when the new prompt repeats them.
    assert stats.reused_tokens >= len(cached_and_kept)
    assert stats.prefilled_tokens == len(second.selection.indices) - stats.reused_tokens
