"""`Chunked`: select whole chunks of consecutive tokens instead of single tokens (the paper's default)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import InvalidRequestError
from ..types import Prompt, Selection, TokenScores
from ..validation import check_int
from .base import (
    Budget,
    BudgetSelector,
    ceil_count,
    dense_selection,
    fill_chunks,
    prompt_protected,
    row_sums,
    score_values,
    selection_from_mask,
)

__all__ = ["Chunked"]


def chunk_means(values: np.ndarray, size: int) -> np.ndarray:
    """The mean score (float64) of each chunk of ``size`` tokens; a shorter last chunk is the mean of its own tokens."""
    n = int(values.shape[0])
    chunks = math.ceil(n / size)
    padded = np.zeros(chunks * size, dtype=np.float64)
    padded[:n] = values
    lengths = np.full(chunks, float(size))
    lengths[-1] = n - (chunks - 1) * size
    means = row_sums(padded.reshape(chunks, size)) / lengths
    # A chunk holding a -inf score (a NaN from the scorer) ranks last, not as NaN.
    return np.nan_to_num(means, nan=-math.inf)


@dataclass(frozen=True)
class Chunked:
    """Keep whole chunks: split the prompt into chunks of ``size`` tokens, score each chunk by the mean
    of its tokens, keep the top ``ceil(chunks * rate)`` chunks in prompt order.

    The budget comes from ``inner``, a budget selector: with `KeepRate` the chunk count is
    ``ceil(chunks * rate)`` (the paper's rule); with a token count (`TokenBudget`, `Adaptive`) it is
    ``ceil(count / size)``. Either way the budget is rounded up to whole chunks. The last chunk may
    be shorter than ``size``; its score is the mean of its own tokens (no padding drags it down) and
    it counts as one chunk.

    Tokens that must be kept (protected, see `Protect`) count toward the budget: the budget is
    ``ceil(chunks * rate) * size`` tokens, protected tokens outside the chosen chunks use one token
    each, and chunks are added best first while the budget is not reached.

    Example::

        Chunked(KeepRate(0.1), size=32)  # the paper's selection

    Raises:
        InvalidRequestError: ``size`` is not an integer >= 1, or ``inner`` is not a budget selector.
    """

    inner: BudgetSelector
    size: int = 32

    def __post_init__(self) -> None:
        if not isinstance(self.inner, BudgetSelector):
            raise InvalidRequestError(
                "Chunked wraps a budget selector (KeepRate, TokenBudget or Adaptive), got "
                f"{getattr(self.inner, 'name', type(self.inner).__name__)}; to protect tokens write "
                "Protect(Chunked(...)), not Chunked(Protect(...))",
                param="selector",
            )
        check_int(self.size, "chunk size", param="chunk_size", minimum=1)

    @property
    def name(self) -> str:
        return f"Chunked({self.inner.name}, {self.size})"

    def _chunks_to_keep(self, n: int, budget: Budget) -> tuple[int, int]:
        chunks = math.ceil(n / self.size)
        wanted = ceil_count(chunks * budget.rate) if budget.by_rate else ceil_count(budget.count / self.size)
        return chunks, min(chunks, max(1, wanted))

    def decide_without_scores(self, prompt: Prompt) -> Selection | None:
        """Dense when the inner budget or the chunk count covers the whole prompt (e.g. one chunk)."""
        forced = prompt_protected(prompt)
        budget = self.inner.budget(prompt, None, forced)
        if budget is None:
            return None
        chunks, keep = self._chunks_to_keep(prompt.n, budget)
        if budget.count >= prompt.n or keep >= chunks:
            reason = f"chunked {self.size} over {budget.reason}: all {chunks} chunks"
            return dense_selection(forced, reason, requested_rate=budget.rate, chunk_size=self.size)
        return None

    def expected_kept(self, prompt: Prompt) -> int | None:
        """The chunk budget in tokens (whole chunks), when the inner budget is known without scores."""
        estimate = self.inner.expected_kept(prompt)
        if estimate is None:
            return None
        forced = prompt_protected(prompt)
        budget = self.inner.budget(prompt, None, forced)
        if budget is None:  # a budget known only from scores: its upper estimate, rounded to chunks
            return min(prompt.n, ceil_count(estimate / self.size) * self.size)
        _, keep = self._chunks_to_keep(prompt.n, budget)
        return min(prompt.n, max(keep * self.size, int(forced.sum())))

    def select(self, prompt: Prompt, scores: TokenScores) -> Selection:
        """Keep the best chunks within the inner selector's rate (plus ``prompt.protected``)."""
        return self.fill(prompt, scores, np.zeros(prompt.n, dtype=bool))

    def fill(self, prompt: Prompt, scores: TokenScores, forced: np.ndarray) -> Selection:
        """Keep ``forced`` and add the best chunks until the chunk budget is reached."""
        values = score_values(prompt, scores)
        forced = np.asarray(forced, dtype=bool) | prompt_protected(prompt)
        n = prompt.n
        budget = self.inner.budget(prompt, values, forced)
        if budget is None:  # pragma: no cover - every budget is defined once scores are given
            raise RuntimeError(f"{self.inner.name} gave no budget although scores were given")
        chunks, keep_chunks = self._chunks_to_keep(n, budget)
        if keep_chunks >= chunks or budget.count >= n:
            return dense_selection(
                forced,
                f"chunked {self.size} over {budget.reason}: all {chunks} chunks",
                requested_rate=budget.rate,
                chunk_size=self.size,
            )
        lengths = np.full(chunks, self.size, dtype=np.int64)
        lengths[-1] = n - (chunks - 1) * self.size
        # Every chunk costs `size`, the shorter last one too: it counts as one chunk of the budget.
        keep, chosen = fill_chunks(
            chunk_means(values, self.size),
            np.arange(n) // self.size,
            lengths,
            np.full(chunks, self.size, dtype=np.int64),
            forced,
            keep_chunks * self.size,
        )
        reason = f"chunked {self.size} over {budget.reason}: {chosen}/{chunks} chunks"
        return selection_from_mask(keep, forced, requested_rate=budget.rate, reason=reason, chunk_size=self.size)
