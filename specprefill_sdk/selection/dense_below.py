"""`DenseBelow`: prefill short prompts whole, without running the draft model."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import InvalidRequestError
from ..interfaces import KeepEstimating, Selector
from ..types import Prompt, Selection, TokenScores
from ..validation import check_int
from .base import FillSelector, dense_selection, prompt_protected, score_values, selection_from_mask

__all__ = ["DenseBelow"]


@dataclass(frozen=True)
class DenseBelow:
    """Keep every token of prompts shorter than ``tokens``; longer prompts go to ``inner``.

    Short prompts gain little from a sparse prefill and the draft pass costs time, so the decision
    is made without scores and the pipeline skips the draft. (`Adaptive` has the same switch
    built in as ``dense_below_tokens``.)

    Example::

        DenseBelow(Protect(Chunked(KeepRate(0.1), 32)), tokens=1024)

    Raises:
        InvalidRequestError: ``tokens`` is not an integer >= 0.
    """

    inner: Selector
    tokens: int = 1024

    def __post_init__(self) -> None:
        if not callable(getattr(self.inner, "select", None)):
            raise InvalidRequestError(f"DenseBelow wraps a selector, got {self.inner!r}", param="selector")
        check_int(self.tokens, "tokens", param="tokens", minimum=0)

    @property
    def name(self) -> str:
        return f"DenseBelow({self.inner.name}, {self.tokens})"

    def _dense(self, prompt: Prompt, forced: np.ndarray) -> Selection:
        return dense_selection(forced, f"dense below {self.tokens} tokens", requested_rate=1.0)

    def decide_without_scores(self, prompt: Prompt) -> Selection | None:
        """Dense for prompts shorter than ``tokens``, else whatever ``inner`` decides."""
        if prompt.n < self.tokens:
            mask = getattr(self.inner, "mask", None)
            forced = mask(prompt) if callable(mask) else prompt_protected(prompt)
            return self._dense(prompt, forced)
        return self.inner.decide_without_scores(prompt)

    def expected_kept(self, prompt: Prompt) -> int | None:
        """Every token of a short prompt, else ``inner``'s estimate (None when it cannot say)."""
        if prompt.n < self.tokens:
            return prompt.n
        return self.inner.expected_kept(prompt) if isinstance(self.inner, KeepEstimating) else None

    def select(self, prompt: Prompt, scores: TokenScores) -> Selection:
        """Dense for short prompts, else ``inner.select``."""
        return self.fill(prompt, scores, np.zeros(prompt.n, dtype=bool))

    def fill(self, prompt: Prompt, scores: TokenScores, forced: np.ndarray) -> Selection:
        """Like `select`, keeping ``forced`` too."""
        forced = np.asarray(forced, dtype=bool)
        if prompt.n < self.tokens:
            score_values(prompt, scores)  # scores for another prompt are an error here too
            mask = getattr(self.inner, "mask", None)
            own = np.asarray(mask(prompt), dtype=bool) if callable(mask) else prompt_protected(prompt)
            return self._dense(prompt, forced | own)
        if isinstance(self.inner, FillSelector):
            return self.inner.fill(prompt, scores, forced)
        chosen = self.inner.select(prompt, scores)
        if not bool(forced.any()):
            return chosen
        # A selector without `fill` cannot count forced tokens toward its budget: add them on top.
        return selection_from_mask(
            chosen.mask().numpy() | forced,
            forced,
            requested_rate=chosen.requested_rate,
            chunk_size=chosen.chunk_size,
            reason=chosen.reason,
        )
