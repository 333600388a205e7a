"""Selectors: which prompt tokens the target prefills, given one score per token.

Small composable dataclasses, one per file. Budget selectors set how many tokens to keep
(`KeepRate`, `TokenBudget`, `Adaptive`); wrappers change how they are chosen (`Chunked`: fixed
windows, `StructuredChunks`: chunks cut where the text breaks), what is always kept (`Protect`) or
when nothing is dropped (`DenseBelow`).

Example::

    from specprefill_sdk.selection import Chunked, KeepRate, Protect

    selector = Protect(Chunked(KeepRate(0.1), size=32), sink=1, tail=True)
    selection = selector.select(prompt, scores)
    selection.indices, selection.protected, selection.reason
"""

from __future__ import annotations

from .adaptive import Adaptive
from .base import Budget, BudgetSelector, FillSelector
from .chunked import Chunked
from .dense_below import DenseBelow
from .keep_rate import KeepRate
from .protect import TEXT_TAIL_TOKENS, Protect
from .structured import StructuredChunks
from .token_budget import TokenBudget

__all__ = [
    "TEXT_TAIL_TOKENS",
    "Adaptive",
    "Budget",
    "BudgetSelector",
    "Chunked",
    "DenseBelow",
    "FillSelector",
    "KeepRate",
    "Protect",
    "StructuredChunks",
    "TokenBudget",
]
