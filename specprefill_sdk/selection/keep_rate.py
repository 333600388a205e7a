"""`KeepRate`: keep a fixed share of the prompt, the top-scored ``ceil(rate * n)`` tokens."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..types import Prompt
from ..validation import check_rate
from .base import Budget, BudgetSelector, ceil_count

__all__ = ["KeepRate"]


@dataclass(frozen=True)
class KeepRate(BudgetSelector):
    """Keep the top-scored ``ceil(rate * n)`` tokens (at least one) of an ``n``-token prompt.

    ``rate=1.0`` keeps everything and is decided without scores, so the pipeline skips the draft.

    Example::

        KeepRate(0.1).select(prompt, scores).kept  # ceil(0.1 * prompt.n)

    Raises:
        InvalidRequestError: ``rate`` is not in (0, 1].
    """

    rate: float = 0.1

    def __post_init__(self) -> None:
        object.__setattr__(self, "rate", check_rate(self.rate, "keep rate", param="keep_rate"))

    @property
    def name(self) -> str:
        return f"KeepRate({self.rate:g})"

    def budget(self, prompt: Prompt, values: np.ndarray | None, forced: np.ndarray) -> Budget:
        count = min(prompt.n, max(1, ceil_count(self.rate * prompt.n)))
        return Budget(count=count, rate=self.rate, reason=f"keep-rate {self.rate:g}")
