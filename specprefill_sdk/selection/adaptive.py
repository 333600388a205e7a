"""`Adaptive`: keep as many tokens as it takes to cover a share of the score mass, within bounds."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import InvalidRequestError
from ..types import Prompt
from ..validation import check_int, check_rate
from .base import Budget, BudgetSelector, ceil_count, prompt_protected, total

__all__ = ["Adaptive"]


@dataclass(frozen=True)
class Adaptive(BudgetSelector):
    """Keep the smallest set of tokens holding ``coverage`` of the score mass, clamped to
    ``[max(min_rate * n, min_tokens), max_rate * n]`` of an ``n``-token prompt; prompts under
    ``dense_below_tokens`` are prefilled whole.

    ``min_tokens`` is a floor in tokens, so a short prompt keeps proportionally more than a long one:
    a question needs about as many kept tokens of evidence whatever the length of the text around it.
    The ceiling ``max_rate * n`` wins over the floor when they cross.

    A prompt whose importance is concentrated on few tokens keeps few; one whose scores are flat
    keeps up to ``max_rate``. The mass is measured over the tokens that are not already forced
    (protected): the attention sink alone often holds most of the attention and is kept anyway.
    Negative scores are shifted so the smallest is zero; all-zero scores keep ``max_rate``.
    The dense decision for short prompts needs no scores, so the pipeline skips the draft for them.

    Example::

        Adaptive(coverage=0.9, min_rate=0.05, max_rate=0.5, dense_below_tokens=1024)
        Adaptive(coverage=0.8, min_rate=0.1, max_rate=0.3, min_tokens=1024)

    Raises:
        InvalidRequestError: a rate or the coverage outside (0, 1], ``min_rate > max_rate``, or a
            negative ``dense_below_tokens`` or ``min_tokens``.
    """

    coverage: float = 0.9
    min_rate: float = 0.05
    max_rate: float = 0.5
    dense_below_tokens: int = 1024
    min_tokens: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "coverage", check_rate(self.coverage, "coverage", param="coverage"))
        object.__setattr__(self, "min_rate", check_rate(self.min_rate, "min_rate", param="min_rate"))
        object.__setattr__(self, "max_rate", check_rate(self.max_rate, "max_rate", param="max_rate"))
        if self.min_rate > self.max_rate:
            raise InvalidRequestError(
                f"min_rate ({self.min_rate:g}) must not exceed max_rate ({self.max_rate:g})", param="min_rate"
            )
        check_int(self.dense_below_tokens, "dense_below_tokens", param="dense_below_tokens", minimum=0)
        check_int(self.min_tokens, "min_tokens", param="min_tokens", minimum=0)

    @property
    def name(self) -> str:
        floor = f", min_tokens={self.min_tokens}" if self.min_tokens else ""
        return (
            f"Adaptive(coverage={self.coverage:g}, min_rate={self.min_rate:g}, max_rate={self.max_rate:g}, "
            f"dense_below_tokens={self.dense_below_tokens}{floor})"
        )

    def budget(self, prompt: Prompt, values: np.ndarray | None, forced: np.ndarray) -> Budget | None:
        n = prompt.n
        if n < self.dense_below_tokens:
            return Budget(count=n, rate=1.0, reason=f"adaptive: dense below {self.dense_below_tokens} tokens")
        if values is None:
            return None
        high = min(n, max(1, ceil_count(self.max_rate * n)))
        low = min(high, max(1, ceil_count(self.min_rate * n), self.min_tokens))
        n_forced = int(forced.sum())
        wanted = n_forced + self._covering_count(values[~forced])
        count = min(max(wanted, low), high)
        note = ""
        if wanted < low:
            by_tokens = self.min_tokens > ceil_count(self.min_rate * n)
            floor = f"min_tokens {self.min_tokens}" if by_tokens else f"min_rate {self.min_rate:g}"
            note = f", raised to {floor}"
            if by_tokens and self.min_tokens > high:  # the ceiling wins where the two cross
                note += f", capped at max_rate {self.max_rate:g}"
        elif wanted > high:
            note = f", capped at max_rate {self.max_rate:g}"
        return Budget(
            count=count,
            rate=count / n,
            reason=f"adaptive: {self.coverage:g} of the score mass in {wanted} tokens{note}",
            by_rate=False,
        )

    def expected_kept(self, prompt: Prompt) -> int | None:
        """At most ``max_rate`` of the prompt (all of it below ``dense_below_tokens``): the rest needs scores."""
        n = prompt.n
        if n < self.dense_below_tokens:
            return n
        return min(n, max(1, ceil_count(self.max_rate * n), int(prompt_protected(prompt).sum())))

    def _covering_count(self, values: np.ndarray) -> int:
        """The fewest tokens whose scores sum to ``coverage`` of the total."""
        if values.size == 0:
            return 0
        finite = np.isfinite(values)
        mass = np.where(finite, values, 0).astype(np.float64)
        if finite.any():
            smallest = mass[finite].min()
            if smallest < 0:
                mass = np.where(finite, mass - smallest, 0.0)
        whole = total(mass)
        if whole <= 0:
            return int(values.size)
        cumulative = np.cumsum(np.sort(mass)[::-1])
        # Tolerance: a coverage of 1.0 must not fail on rounding of the cumulative sum.
        index = int(np.searchsorted(cumulative, self.coverage * whole * (1 - 1e-12)))
        return min(index + 1, int(values.size))
