"""What the selectors share: the token budget, score checks and the fill step.

A *budget selector* (`KeepRate`, `TokenBudget`, `Adaptive`) says how many tokens a prompt may keep;
the fill step keeps the already-forced tokens (protected ones) and tops them up with the best-scored
others until the budget is reached. Protected tokens therefore count toward the budget. Wrappers
(`Chunked`, `StructuredChunks`, `Protect`) reuse the same budget and change how the rest is filled or
what is forced; the two chunk selectors share the chunk fill step, `fill_chunks`.

Scores and masks are numpy arrays. The selection's ops are small, and torch hands an op over 32,768
elements or more to its intra-op thread pool, whose wake-ups cost more than the ops on a busy host
(docs/benchmarks.md, "Host time around the model steps"). The two float64 sums whose last bit
depends on the order of their additions, `row_sums` and `total`, are still torch's, run on the
calling thread, so selections keep the rounding, and the choices, that torch's ops gave them.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
import torch

from ..errors import InvalidRequestError
from ..types import Prompt, Selection, TokenScores

__all__ = [
    "Budget",
    "BudgetSelector",
    "FillSelector",
    "bool_array",
    "ceil_count",
    "fill_chunks",
    "row_sums",
    "score_values",
    "total",
]

# Rates times lengths are computed in floating point: 0.1 * 30 is 3.0000000000000004, whose ceiling
# would keep one token (or chunk) too many. A tolerance far below one token avoids that.
_EPS = 1e-9

# torch may run an op over this many elements or more on its intra-op thread pool
# (at::internal::GRAIN_SIZE); an op over fewer runs on the calling thread.
_TORCH_GRAIN = 32768


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


def score_values(prompt: Prompt, scores: TokenScores) -> np.ndarray:
    """The scores as a float32 array of length ``prompt.n``, NaN replaced by -inf.

    `TokenScores` moved its values to the CPU when it was built: they are read here without a copy.

    Raises:
        InvalidRequestError: the scores are for a prompt of another length.
    """
    if len(scores) != prompt.n:
        raise InvalidRequestError(f"got {len(scores)} scores for a prompt of {prompt.n} tokens", param="scores")
    values = scores.values.detach().to(torch.float32).numpy()
    return np.nan_to_num(values, nan=-math.inf)


def prompt_protected(prompt: Prompt) -> np.ndarray:
    """The caller's own protected mask of ``prompt`` as a bool array (a new one)."""
    return bool_array(prompt.protected)


def bool_array(flags: Sequence[bool]) -> np.ndarray:
    """``np.array(flags, dtype=bool)``, many times faster for long sequences (read through one buffer)."""
    if not flags:
        return np.zeros(0, dtype=bool)
    return np.frombuffer(bytearray(flags), dtype=np.uint8).astype(bool)


def row_sums(table: np.ndarray) -> np.ndarray:
    """The sum of each row of a 2-D float64 array, by torch's reduction, on the calling thread.

    Its rounding is the one chunk scores have always had: torch adds a row's values in its own order,
    numpy in another, and in float64 the two can differ in the last bit. torch sums each row on its
    own, so the table is summed in pieces below torch's parallel grain without changing a bit; a row
    as long as the grain is summed with the rest, as before.
    """
    rows = torch.from_numpy(table)
    per_piece = (_TORCH_GRAIN - 1) // table.shape[1] or len(table)
    return np.concatenate([piece.sum(dim=1).numpy() for piece in rows.split(per_piece)])


def total(values: np.ndarray) -> float:
    """The sum of a 1-D float64 array by torch's reduction, on the calling thread.

    Up to torch's parallel grain this is ``tensor.sum()`` itself. Beyond it torch splits the sum over
    its threads, so its last bit follows the thread count; here the pieces are summed in order instead.
    """
    return sum(float(piece.sum()) for piece in torch.from_numpy(values).split(_TORCH_GRAIN))


def selection_from_mask(
    keep: np.ndarray,
    forced: np.ndarray,
    *,
    requested_rate: float | None,
    reason: str,
    chunk_size: int | None = None,
    dense: bool = False,
) -> Selection:
    """A `Selection` of the True entries of ``keep``; ``forced`` marks which of them were protected."""
    n = int(keep.shape[0])
    where = np.flatnonzero(keep)
    indices: list[int] = where.tolist()
    protected: list[bool] = forced[where].tolist()
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
    forced: np.ndarray, reason: str, *, requested_rate: float | None = 1.0, chunk_size: int | None = None
) -> Selection:
    """Every token kept (a dense prefill), protected ones marked."""
    keep = np.ones(forced.shape, dtype=bool)
    return selection_from_mask(
        keep, forced, requested_rate=requested_rate, reason=reason, chunk_size=chunk_size, dense=True
    )


def descending(values: np.ndarray) -> np.ndarray:
    """The indices that sort ``values`` from the largest down; ties go to the earlier index."""
    return np.argsort(-values, kind="stable")


def fill_tokens(values: np.ndarray, forced: np.ndarray, count: int) -> np.ndarray:
    """Keep ``forced`` plus the best-scored other tokens until ``count`` tokens are kept.

    Ties go to the earlier token, so equal scores give a deterministic selection.
    """
    keep = forced.copy()
    rest = count - int(forced.sum())
    if rest <= 0:
        return keep
    order = descending(np.where(forced, -math.inf, values))
    free = order[~forced[order]]
    keep[free[:rest]] = True
    return keep


def fill_chunks(
    means: np.ndarray,
    chunk_of: np.ndarray,
    lengths: np.ndarray,
    charge: np.ndarray,
    forced: np.ndarray,
    limit: int,
) -> tuple[np.ndarray, int]:
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
    forced_per_chunk = np.bincount(chunk_of[forced], minlength=chunks)
    order = descending(means)
    useful = order[forced_per_chunk[order] != lengths[order]]
    costs = charge[useful] - forced_per_chunk[useful]
    before = np.cumsum(costs) - costs  # spent on the chunks before each candidate
    chosen_chunks = useful[int(forced.sum()) + before < limit]
    picked = np.zeros(chunks, dtype=bool)
    picked[chosen_chunks] = True
    return forced | picked[chunk_of], int(chosen_chunks.size)


@runtime_checkable
class FillSelector(Protocol):
    """A selector that can complete a selection around tokens that must be kept.

    ``fill(prompt, scores, forced)`` keeps every token where ``forced`` (a bool array of length
    ``n``) is True, counts them toward its budget and fills the rest; `Protect` relies on it.
    """

    @property
    def name(self) -> str: ...

    def select(self, prompt: Prompt, scores: TokenScores) -> Selection: ...

    def decide_without_scores(self, prompt: Prompt) -> Selection | None: ...

    def fill(self, prompt: Prompt, scores: TokenScores, forced: np.ndarray) -> Selection: ...


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
    def budget(self, prompt: Prompt, values: np.ndarray | None, forced: np.ndarray) -> Budget | None:
        """The budget for ``prompt``; ``None`` when it depends on scores and ``values`` is None.

        ``values`` are `score_values` (float32), ``forced`` the tokens kept by force (bool), both of length ``n``.
        """

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
        return self.fill(prompt, scores, np.zeros(prompt.n, dtype=bool))

    def fill(self, prompt: Prompt, scores: TokenScores, forced: np.ndarray) -> Selection:
        """Keep ``forced`` and fill the rest of the budget with the top-scored tokens."""
        values = score_values(prompt, scores)
        forced = np.asarray(forced, dtype=bool) | prompt_protected(prompt)
        budget = self.budget(prompt, values, forced)
        if budget is None:  # pragma: no cover - every budget is defined once scores are given
            raise RuntimeError(f"{self.name} gave no budget although scores were given")
        keep = fill_tokens(values, forced, budget.count)
        return selection_from_mask(keep, forced, requested_rate=budget.rate, reason=budget.reason)
