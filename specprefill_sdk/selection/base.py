"""What the selectors share: the token budget, score checks and the fill step.

A *budget selector* (`KeepRate`, `TokenBudget`, `Adaptive`) says how many tokens a prompt may keep;
the fill step keeps the already-forced tokens (protected ones) and tops them up with the best-scored
others until the budget is reached. Protected tokens therefore count toward the budget. Wrappers
(`Chunked`, `StructuredChunks`, `Protect`) reuse the same budget and change how the rest is filled or
what is forced; the two chunk selectors share the chunk fill step, `fill_chunks`.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from ..errors import InvalidRequestError
from ..types import Prompt, Selection, TokenScores

__all__ = [
    "Budget",
    "BudgetSelector",
    "FillSelector",
    "bool_tensor",
    "ceil_count",
    "fill_chunks",
    "score_values",
]

# Rates times lengths are computed in floating point: 0.1 * 30 is 3.0000000000000004, whose ceiling
# would keep one token (or chunk) too many. A tolerance far below one token avoids that.
_EPS = 1e-9


def ceil_count(x: float) -> int:
    """``ceil(x)`` that ignores floating-point noise: ``ceil_count(0.1 * 30) == 3``."""
    return math.ceil(x - _EPS)


@dataclass(frozen=True)
class Budget:
    """How much of one prompt a budget selector keeps: ``count`` tokens, i.e. ``rate`` of ``n``.

    ``by_rate`` tells `Chunked` how to turn it into chunks: ``ceil(chunks * rate)`` (the paper's
    rule, for `KeepRate`) or, when False, ``ceil(count / size)`` (a token count, for `TokenBudget`
    and `Adaptive`). Both round up to whole chunks.
    """

    count: int
    rate: float
    reason: str
    by_rate: bool = True


def score_values(prompt: Prompt, scores: TokenScores) -> torch.Tensor:
    """The scores as a float32 CPU tensor of length ``prompt.n``, NaN replaced by -inf.

    Raises:
        InvalidRequestError: the scores are for a prompt of another length.
    """
    if len(scores) != prompt.n:
        raise InvalidRequestError(f"got {len(scores)} scores for a prompt of {prompt.n} tokens", param="scores")
    values = scores.values.detach().to(torch.float32)
    return torch.nan_to_num(values, nan=-math.inf)


def prompt_protected(prompt: Prompt) -> torch.Tensor:
    """The caller's own protected mask of ``prompt`` as a bool tensor."""
    return bool_tensor(prompt.protected)


def bool_tensor(flags: Sequence[bool]) -> torch.Tensor:
    """``torch.tensor(flags, dtype=torch.bool)``, about ten times faster for long sequences."""
    if not flags:
        return torch.zeros(0, dtype=torch.bool)
    return torch.frombuffer(bytearray(flags), dtype=torch.uint8).to(torch.bool)


def selection_from_mask(
    keep: torch.Tensor,
    forced: torch.Tensor,
    *,
    requested_rate: float | None,
    reason: str,
    chunk_size: int | None = None,
    dense: bool = False,
) -> Selection:
    """A `Selection` of the True entries of ``keep``; ``forced`` marks which of them were protected."""
    n = int(keep.shape[0])
    where = torch.nonzero(keep, as_tuple=False).flatten()
    indices: list[int] = where.tolist()
    protected: list[bool] = forced.to(torch.bool)[where].tolist()
    return Selection(
        indices=tuple(indices),
        n=n,
        protected=tuple(protected),
        dense=dense or len(indices) == n,
        requested_rate=requested_rate,
        chunk_size=chunk_size,
        reason=reason,
    )


def dense_selection(
    forced: torch.Tensor, reason: str, *, requested_rate: float | None = 1.0, chunk_size: int | None = None
) -> Selection:
    """Every token kept (a dense prefill), protected ones marked."""
    keep = torch.ones_like(forced, dtype=torch.bool)
    return selection_from_mask(
        keep, forced, requested_rate=requested_rate, reason=reason, chunk_size=chunk_size, dense=True
    )


def fill_tokens(values: torch.Tensor, forced: torch.Tensor, count: int) -> torch.Tensor:
    """Keep ``forced`` plus the best-scored other tokens until ``count`` tokens are kept.

    Ties go to the earlier token, so equal scores give a deterministic selection.
    """
    keep = forced.clone()
    rest = count - int(forced.sum())
    if rest <= 0:
        return keep
    candidates = values.masked_fill(forced, -math.inf)
    order = torch.sort(candidates, descending=True, stable=True).indices
    free = order[~forced[order]]
    keep[free[:rest]] = True
    return keep


def fill_chunks(
    means: torch.Tensor,
    chunk_of: torch.Tensor,
    lengths: torch.Tensor,
    charge: torch.Tensor,
    forced: torch.Tensor,
    limit: int,
) -> tuple[torch.Tensor, int]:
    """Keep ``forced`` and add whole chunks, best ``means`` first, while less than ``limit`` is spent.

    ``chunk_of[t]`` is the chunk of token ``t``, ``lengths`` the tokens of each chunk. The forced
    tokens are spent first, one each; a chosen chunk then costs ``charge`` minus its forced tokens
    (they are counted already). A chunk is added while the amount spent before it is below ``limit``,
    so the last one may overshoot it by less than its cost. Chunks that protection keeps whole add
    nothing and are skipped. Ties go to the earlier chunk.

    Returns:
        The kept mask and the number of chunks chosen.
    """
    chunks = int(lengths.shape[0])
    forced_per_chunk = torch.zeros(chunks, dtype=torch.long).index_add_(0, chunk_of, forced.to(torch.long))
    order = torch.sort(means, descending=True, stable=True).indices
    useful = order[forced_per_chunk[order] != lengths[order]]
    costs = charge[useful] - forced_per_chunk[useful]
    before = torch.cumsum(costs, dim=0) - costs  # spent on the chunks before each candidate
    chosen_chunks = useful[int(forced.sum()) + before < limit]
    picked = torch.zeros(chunks, dtype=torch.bool)
    picked[chosen_chunks] = True
    return forced | picked[chunk_of], int(chosen_chunks.numel())


@runtime_checkable
class FillSelector(Protocol):
    """A selector that can complete a selection around tokens that must be kept.

    ``fill(prompt, scores, forced)`` keeps every token where ``forced`` is True, counts them toward
    its budget and fills the rest; `Protect` relies on it.
    """

    @property
    def name(self) -> str: ...

    def select(self, prompt: Prompt, scores: TokenScores) -> Selection: ...

    def decide_without_scores(self, prompt: Prompt) -> Selection | None: ...

    def fill(self, prompt: Prompt, scores: TokenScores, forced: torch.Tensor) -> Selection: ...


class BudgetSelector(ABC):
    """Base of the selectors that set a token budget: token-level top-k within the budget.

    Subclasses implement `budget`. Every selector honours ``prompt.protected`` (spans the caller
    marked when building the prompt): those tokens are kept and count toward the budget.
    """

    @property
    @abstractmethod
    def name(self) -> str:
        """A short description, e.g. ``KeepRate(0.1)``."""

    @abstractmethod
    def budget(self, prompt: Prompt, values: torch.Tensor | None, forced: torch.Tensor) -> Budget | None:
        """The budget for ``prompt``; ``None`` when it depends on scores and ``values`` is None."""

    def decide_without_scores(self, prompt: Prompt) -> Selection | None:
        """Keep everything without scoring when the budget covers the whole prompt, else None."""
        forced = prompt_protected(prompt)
        budget = self.budget(prompt, None, forced)
        if budget is not None and budget.count >= prompt.n:
            return dense_selection(forced, budget.reason, requested_rate=budget.rate)
        return None

    def expected_kept(self, prompt: Prompt) -> int | None:
        """The budget's token count when it is known without scores (protected tokens count toward it), else None."""
        forced = prompt_protected(prompt)
        budget = self.budget(prompt, None, forced)
        return None if budget is None else max(budget.count, int(forced.sum()))

    def select(self, prompt: Prompt, scores: TokenScores) -> Selection:
        """Keep the top-scored tokens within the budget (plus ``prompt.protected``)."""
        return self.fill(prompt, scores, torch.zeros(prompt.n, dtype=torch.bool))

    def fill(self, prompt: Prompt, scores: TokenScores, forced: torch.Tensor) -> Selection:
        """Keep ``forced`` and fill the rest of the budget with the top-scored tokens."""
        values = score_values(prompt, scores)
        forced = forced.to(torch.bool) | prompt_protected(prompt)
        budget = self.budget(prompt, values, forced)
        if budget is None:  # pragma: no cover - every budget is defined once scores are given
            raise RuntimeError(f"{self.name} gave no budget although scores were given")
        keep = fill_tokens(values, forced, budget.count)
        return selection_from_mask(keep, forced, requested_rate=budget.rate, reason=budget.reason)
