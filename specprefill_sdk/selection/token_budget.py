"""`TokenBudget`: keep at most ``k`` tokens whatever the prompt's length."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..types import Prompt
from ..validation import check_int
from .base import Budget, BudgetSelector

__all__ = ["TokenBudget"]


@dataclass(frozen=True)
class TokenBudget(BudgetSelector):
    """Keep the top-scored ``k`` tokens; a prompt of at most ``k`` tokens is kept whole without scoring.

    Example::

        TokenBudget(512).select(prompt, scores).kept  # min(512, prompt.n)

    Raises:
        InvalidRequestError: ``k`` is not an integer >= 1.
    """

    k: int = 1024

    def __post_init__(self) -> None:
        check_int(self.k, "token budget", param="token_budget", minimum=1)

    @property
    def name(self) -> str:
        return f"TokenBudget({self.k})"

    def budget(self, prompt: Prompt, values: np.ndarray | None, forced: np.ndarray) -> Budget:
        count = min(self.k, prompt.n)
        rate = count / prompt.n if prompt.n else 1.0
        return Budget(count=count, rate=rate, reason=f"token-budget {self.k}", by_rate=False)
