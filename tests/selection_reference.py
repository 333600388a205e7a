"""The selectors as torch computed them before their arithmetic moved to numpy: the slow reference.

`reference_select(selector, prompt, scores)` walks a selector made of the package's classes
(`DenseBelow`, `Protect`, `StructuredChunks`, `Chunked`, `KeepRate`, `TokenBudget`, `Adaptive`) and
selects with the torch code each of them ran until then, op for op, reasons included. From the
package it takes only what does no arithmetic on scores or masks: the text chunks of a prompt and the
budgets of `KeepRate` and `TokenBudget` (counts from ``n`` alone).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import torch

from specprefill_sdk.selection import Adaptive, Chunked, DenseBelow, KeepRate, Protect, StructuredChunks, TokenBudget
from specprefill_sdk.selection.base import Budget, ceil_count
from specprefill_sdk.selection.protect import TEXT_TAIL_TOKENS
from specprefill_sdk.selection.structured import has_text_offsets, text_chunks
from specprefill_sdk.types import TEMPLATE_ROLE, Prompt, Selection, TokenScores

__all__ = ["reference_select"]


def reference_select(selector: object, prompt: Prompt, scores: TokenScores) -> Selection:
    """What ``selector.select(prompt, scores)`` gave when selection ran on torch tensors."""
    return _fill(selector, prompt, scores, torch.zeros(prompt.n, dtype=torch.bool))


def _score_values(prompt: Prompt, scores: TokenScores) -> torch.Tensor:
    assert len(scores) == prompt.n
    values = scores.values.detach().to(torch.float32)
    return torch.nan_to_num(values, nan=-math.inf)


def _bool_tensor(flags: Sequence[bool]) -> torch.Tensor:
    return torch.tensor(list(flags), dtype=torch.bool)


def _prompt_protected(prompt: Prompt) -> torch.Tensor:
    return _bool_tensor(prompt.protected)


def _selection_from_mask(
    keep: torch.Tensor,
    forced: torch.Tensor,
    *,
    requested_rate: float | None,
    reason: str,
    chunk_size: int | None = None,
    dense: bool = False,
) -> Selection:
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


def _dense_selection(
    forced: torch.Tensor, reason: str, *, requested_rate: float | None = 1.0, chunk_size: int | None = None
) -> Selection:
    keep = torch.ones_like(forced, dtype=torch.bool)
    return _selection_from_mask(
        keep, forced, requested_rate=requested_rate, reason=reason, chunk_size=chunk_size, dense=True
    )


def _fill_tokens(values: torch.Tensor, forced: torch.Tensor, count: int) -> torch.Tensor:
    keep = forced.clone()
    rest = count - int(forced.sum())
    if rest <= 0:
        return keep
    candidates = values.masked_fill(forced, -math.inf)
    order = torch.sort(candidates, descending=True, stable=True).indices
    free = order[~forced[order]]
    keep[free[:rest]] = True
    return keep


def _fill_chunks(
    means: torch.Tensor,
    chunk_of: torch.Tensor,
    lengths: torch.Tensor,
    charge: torch.Tensor,
    forced: torch.Tensor,
    limit: int,
) -> tuple[torch.Tensor, int]:
    chunks = int(lengths.shape[0])
    forced_per_chunk = torch.zeros(chunks, dtype=torch.long).index_add_(0, chunk_of, forced.to(torch.long))
    order = torch.sort(means, descending=True, stable=True).indices
    useful = order[forced_per_chunk[order] != lengths[order]]
    costs = charge[useful] - forced_per_chunk[useful]
    before = torch.cumsum(costs, dim=0) - costs
    chosen_chunks = useful[int(forced.sum()) + before < limit]
    picked = torch.zeros(chunks, dtype=torch.bool)
    picked[chosen_chunks] = True
    return forced | picked[chunk_of], int(chosen_chunks.numel())


def chunk_means(values: torch.Tensor, size: int) -> torch.Tensor:
    """`Chunked`'s chunk scores as torch computed them (float64)."""
    n = int(values.shape[0])
    chunks = math.ceil(n / size)
    padded = torch.zeros(chunks * size, dtype=torch.float64)
    padded[:n] = values.to(torch.float64)
    lengths = torch.full((chunks,), float(size), dtype=torch.float64)
    lengths[-1] = n - (chunks - 1) * size
    means = padded.view(chunks, size).sum(dim=1) / lengths
    return torch.nan_to_num(means, nan=-math.inf)


def _segment_means(values: torch.Tensor, chunk_of: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    sums = torch.zeros(int(lengths.shape[0]), dtype=torch.float64).index_add_(0, chunk_of, values.to(torch.float64))
    return torch.nan_to_num(sums / lengths.to(torch.float64), nan=-math.inf)


def _covering_count(coverage: float, values: torch.Tensor) -> int:
    if values.numel() == 0:
        return 0
    finite = torch.isfinite(values)
    mass = torch.where(finite, values, torch.zeros_like(values)).to(torch.float64)
    if finite.any():
        smallest = mass[finite].min()
        if smallest < 0:
            mass = torch.where(finite, mass - smallest, torch.zeros_like(mass))
    total = float(mass.sum())
    if total <= 0:
        return int(values.numel())
    cumulative = torch.cumsum(torch.sort(mass, descending=True).values, dim=0)
    target = torch.tensor([coverage * total * (1 - 1e-12)], dtype=torch.float64)
    index = int(torch.searchsorted(cumulative, target).item())
    return min(index + 1, int(values.numel()))


def _budget(inner: object, prompt: Prompt, values: torch.Tensor, forced: torch.Tensor) -> Budget:
    if isinstance(inner, KeepRate | TokenBudget):  # a count from n alone
        return inner.budget(prompt, None, forced.numpy())
    assert isinstance(inner, Adaptive), inner
    s, n = inner, prompt.n
    if n < s.dense_below_tokens:
        return Budget(count=n, rate=1.0, reason=f"adaptive: dense below {s.dense_below_tokens} tokens")
    high = min(n, max(1, ceil_count(s.max_rate * n)))
    low = min(high, max(1, ceil_count(s.min_rate * n), s.min_tokens))
    n_forced = int(forced.sum())
    wanted = n_forced + _covering_count(s.coverage, values[~forced])
    count = min(max(wanted, low), high)
    note = ""
    if wanted < low:
        by_tokens = s.min_tokens > ceil_count(s.min_rate * n)
        floor = f"min_tokens {s.min_tokens}" if by_tokens else f"min_rate {s.min_rate:g}"
        note = f", raised to {floor}"
        if by_tokens and s.min_tokens > high:
            note += f", capped at max_rate {s.max_rate:g}"
    elif wanted > high:
        note = f", capped at max_rate {s.max_rate:g}"
    return Budget(
        count=count,
        rate=count / n,
        reason=f"adaptive: {s.coverage:g} of the score mass in {wanted} tokens{note}",
        by_rate=False,
    )


def protect_mask(p: Protect, prompt: Prompt) -> torch.Tensor:
    """`Protect.mask` as torch computed it."""
    n = prompt.n
    mask = _prompt_protected(prompt)
    if n == 0:
        return mask
    mask[: p.sink] = True
    if p.tail is not False:
        if prompt.generation_start < n:
            mask[prompt.generation_start :] = True
        tail = TEXT_TAIL_TOKENS if p.tail is True and prompt.generation_start >= n else int(p.tail)
        if tail > 0:
            mask[max(0, n - tail) :] = True
    if p.roles:
        wanted = set(p.roles)
        mask |= _bool_tensor([r in wanted for r in prompt.roles])
    if p.last_user_turn and prompt.messages:
        users = [i for i, m in enumerate(prompt.messages) if m.role == "user"]
        if users:
            mask |= torch.tensor(prompt.message_index, dtype=torch.long) == users[-1]
    if p.spans:
        mask |= torch.tensor([any(a < e and s < b for s, e in p.spans) for a, b in prompt.offsets], dtype=torch.bool)
    if p.special_tokens:
        template = _bool_tensor([r == TEMPLATE_ROLE for r in prompt.roles])
        mask |= _bool_tensor(prompt.special) | template
    return mask


def _chunks_to_keep(size: int, n: int, budget: Budget) -> tuple[int, int]:
    chunks = math.ceil(n / size)
    wanted = ceil_count(chunks * budget.rate) if budget.by_rate else ceil_count(budget.count / size)
    return chunks, min(chunks, max(1, wanted))


def _fill_chunked(c: Chunked, prompt: Prompt, scores: TokenScores, forced: torch.Tensor) -> Selection:
    values = _score_values(prompt, scores)
    forced = forced.to(torch.bool) | _prompt_protected(prompt)
    n = prompt.n
    budget = _budget(c.inner, prompt, values, forced)
    chunks, keep_chunks = _chunks_to_keep(c.size, n, budget)
    if keep_chunks >= chunks or budget.count >= n:
        return _dense_selection(
            forced,
            f"chunked {c.size} over {budget.reason}: all {chunks} chunks",
            requested_rate=budget.rate,
            chunk_size=c.size,
        )
    lengths = torch.full((chunks,), c.size, dtype=torch.long)
    lengths[-1] = n - (chunks - 1) * c.size
    keep, chosen = _fill_chunks(
        chunk_means(values, c.size),
        torch.arange(n) // c.size,
        lengths,
        torch.full((chunks,), c.size, dtype=torch.long),
        forced,
        keep_chunks * c.size,
    )
    reason = f"chunked {c.size} over {budget.reason}: {chosen}/{chunks} chunks"
    return _selection_from_mask(keep, forced, requested_rate=budget.rate, reason=reason, chunk_size=c.size)


def _fill_structured(s: StructuredChunks, prompt: Prompt, scores: TokenScores, forced: torch.Tensor) -> Selection:
    if not has_text_offsets(prompt):
        fixed = _fill_chunked(Chunked(s.inner, s.fallback_size), prompt, scores, forced)
        return replace(fixed, reason=f"no text offsets, fixed chunks of {s.fallback_size}: {fixed.reason}")
    values = _score_values(prompt, scores)
    forced = forced.to(torch.bool) | _prompt_protected(prompt)
    budget = _budget(s.inner, prompt, values, forced)

    def reason(what: str) -> str:
        return f"text chunks {s.min_size}-{s.max_size} over {budget.reason}: {what}"

    if budget.count >= prompt.n:
        return _dense_selection(forced, reason("the whole prompt"), requested_rate=budget.rate)
    if prompt.n <= s.max_size and len(text_chunks(prompt, s.min_size, s.max_size)) <= 1:
        return _dense_selection(forced, reason("one chunk"), requested_rate=budget.rate)
    lengths = torch.tensor(text_chunks(prompt, s.min_size, s.max_size), dtype=torch.long)
    chunk_of = torch.repeat_interleave(torch.arange(int(lengths.shape[0])), lengths)
    means = _segment_means(values, chunk_of, lengths)
    keep, chosen = _fill_chunks(means, chunk_of, lengths, lengths, forced, budget.count)
    return _selection_from_mask(
        keep, forced, requested_rate=budget.rate, reason=reason(f"{chosen}/{int(lengths.shape[0])} chunks")
    )


def _fill(selector: object, prompt: Prompt, scores: TokenScores, forced: torch.Tensor) -> Selection:
    if isinstance(selector, DenseBelow):
        if prompt.n < selector.tokens:
            _score_values(prompt, scores)
            inner = selector.inner
            own = protect_mask(inner, prompt) if isinstance(inner, Protect) else _prompt_protected(prompt)
            return _dense_selection(forced.to(torch.bool) | own, f"dense below {selector.tokens} tokens")
        return _fill(selector.inner, prompt, scores, forced)
    if isinstance(selector, Protect):
        return _fill(selector.inner, prompt, scores, forced.to(torch.bool) | protect_mask(selector, prompt))
    if isinstance(selector, StructuredChunks):
        return _fill_structured(selector, prompt, scores, forced)
    if isinstance(selector, Chunked):
        return _fill_chunked(selector, prompt, scores, forced)
    assert isinstance(selector, KeepRate | TokenBudget | Adaptive), selector
    values = _score_values(prompt, scores)
    forced = forced.to(torch.bool) | _prompt_protected(prompt)
    budget = _budget(selector, prompt, values, forced)
    keep = _fill_tokens(values, forced, budget.count)
    return _selection_from_mask(keep, forced, requested_rate=budget.rate, reason=budget.reason)
