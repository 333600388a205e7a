"""`StructuredChunks`: whole chunks that follow the text (sentences, lines, paragraphs, messages).

`Chunked` cuts the prompt every 32 tokens, wherever that falls: a fact that straddles a cut is kept
half or not at all. This selector cuts where the text itself does, so a kept chunk is a whole
sentence, line or paragraph, and keeps whole chunks exactly as `Chunked` does (same budget, the
same fill step, `base.fill_chunks`).
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import IntEnum
from itertools import chain, groupby, pairwise, starmap

import numpy as np

from ..errors import InvalidRequestError
from ..types import Prompt, Selection, TokenScores
from ..validation import TEXT_CHUNK_MAX_SIZE, TEXT_CHUNK_MIN_SIZE, check_chunk_bounds, check_int
from .base import (
    Budget,
    BudgetSelector,
    dense_selection,
    fill_chunks,
    prompt_protected,
    score_values,
    selection_from_mask,
)
from .chunked import Chunked

__all__ = ["Boundary", "StructuredChunks", "boundaries", "has_text_offsets", "text_chunks"]


class Boundary(IntEnum):
    """How strongly the text breaks after a token; a split prefers the strongest break."""

    NONE = 0
    #: ``.``, ``!`` or ``?`` (closing quotes and brackets after it allowed), then whitespace.
    SENTENCE = 1
    #: Whitespace holding one newline.
    LINE = 2
    #: Whitespace holding two newlines or more (a blank line).
    PARAGRAPH = 3
    #: The next token belongs to another message, or has another role (chat-template glue against
    #: message content, a plain-text prompt's BOS against the text).
    MESSAGE = 4


# A sentence end: the punctuation, closing quotes or brackets, then the whitespace after it (group 1).
_SENTENCE = re.compile(r"[.!?][\"'\u201d\u2019)\]}\u00bb]*(\s+)")
# The first newline of a whitespace run and the rest of the run (`_newline_runs` adds the whitespace
# before it). A pattern that starts with a literal lets the regex engine jump from newline to newline;
# ``\s*\n\s*``, the whole run in one pattern, is tried at every character: about ten times slower.
_NEWLINE = re.compile(r"\n\s*")

#: The breaks a long segment may be cut at, strongest first.
_BY_STRENGTH = sorted((b for b in Boundary if b), reverse=True)


def has_text_offsets(prompt: Prompt) -> bool:
    """Whether ``prompt`` knows the characters of its tokens (False for `Prompt.from_token_ids`)."""
    # starmap compares each (start, end) in C and stops at the first token with text.
    return bool(prompt.text) and any(starmap(operator.lt, prompt.offsets))


def _newline_runs(text: str) -> list[tuple[int, int, int]]:
    """The whitespace runs of ``text`` that hold a newline, whole: ``(start, end, strength)``.

    The strength is the `Boundary`'s plain int, which numpy reads without calling the enum member's
    ``__index__``.
    """
    runs: list[tuple[int, int, int]] = []
    line, paragraph = int(Boundary.LINE), int(Boundary.PARAGRAPH)
    for m in _NEWLINE.finditer(text):
        start, end = m.span()
        first = start
        # The run's whitespace before its first newline (str.isspace is the regex's \s).
        while start > 0 and text[start - 1].isspace():
            start -= 1
        # The match starts at the run's first newline: a second one makes it a paragraph break.
        runs.append((start, end, paragraph if text.find("\n", first + 1, end) >= 0 else line))
    return runs


def _token_ends(prompt: Prompt) -> np.ndarray:
    """The end offset of each token (int64). Read alone, in one C loop: all the offsets as an (n, 2)
    array took nearly three times as long, and `_strengths` needs few of the starts."""
    return np.fromiter(map(operator.itemgetter(1), prompt.offsets), dtype=np.int64, count=prompt.n)


def _run_ends(values: Sequence[object]) -> np.ndarray:
    """The index of the last entry of each run of equal ``values``, but the last run (int64)."""
    # groupby compares neighbours in C: only the runs, a few per message, cost a Python step.
    lengths = [len(list(run)) for _, run in groupby(values)]
    return np.cumsum(lengths[:-1], dtype=np.int64) - 1


def _strengths(prompt: Prompt) -> np.ndarray:
    """`boundaries` as an int8 array of length ``max(n - 1, 0)``."""
    n = prompt.n
    out = np.zeros(max(n - 1, 0), dtype=np.int8)
    if n < 2:
        return out
    text = prompt.text
    sentence = int(Boundary.SENTENCE)
    runs = [(*m.span(1), sentence) for m in _SENTENCE.finditer(text)]
    runs += _newline_runs(text)
    if runs:
        # fromiter reads the flattened triples in one C loop, faster than asarray converts the tuples.
        table = np.fromiter(chain.from_iterable(runs), dtype=np.int64, count=3 * len(runs)).reshape(-1, 3)
        # The cut goes before the first token that reaches past the whitespace (so whitespace-only
        # tokens stay with the text before them), unless that token starts before the whitespace:
        # one token holding the punctuation and the next word is not cut.
        ends = np.maximum.accumulate(_token_ends(prompt))
        after = np.searchsorted(ends, table[:, 1], side="right")
        ok = (after >= 1) & (after < n)
        offsets = prompt.offsets
        starts = np.asarray([offsets[t][0] for t in after[ok].tolist()], dtype=np.int64)
        ok[ok] &= starts >= table[ok, 0]
        np.maximum.at(out, after[ok] - 1, table[ok, 2].astype(np.int8))
    out[_run_ends(prompt.message_index)] = Boundary.MESSAGE
    out[_run_ends(prompt.roles)] = Boundary.MESSAGE
    return out


def boundaries(prompt: Prompt) -> tuple[Boundary, ...]:
    """The break after each token of ``prompt`` but the last (``n - 1`` entries; `Boundary.NONE` where
    the text runs on), read from ``prompt.text`` through the token offsets and from the tokens'
    messages and roles.

    A break after token ``t`` is a cut between ``t`` and ``t + 1``. Text breaks are whitespace runs
    after a sentence end or holding newlines; the cut goes before the first token that reaches past
    the run, so ``"fact." + "\\n" + "\\n" + "The"`` is cut before ``"The"`` and ``"fact" + "."
    + " The"`` before ``" The"``. ``3.5``, a full stop without whitespace after it, is no break.
    """
    return tuple(Boundary(int(s)) for s in _strengths(prompt))


def _section_bounds(strengths: np.ndarray, n: int, min_size: int) -> np.ndarray:
    """The bounds (int64, from 0 to ``n``) of the sections: cut at every message and paragraph break,
    a section shorter than ``min_size`` merged with the next, a short rest with the one before."""
    bounds = [0]
    for end in [*(np.flatnonzero(strengths >= Boundary.PARAGRAPH) + 1).tolist(), n]:
        if end - bounds[-1] >= min_size:
            bounds.append(end)
    if bounds[-1] < n:
        if len(bounds) > 1:
            bounds[-1] = n
        else:
            bounds.append(n)
    return np.array(bounds, dtype=np.int64)


def _best_cuts(cuts_by_strength: list[np.ndarray], starts: np.ndarray, ends: np.ndarray, min_size: int) -> np.ndarray:
    """For each segment ``[start, end)``: the position (a token index) where it is best cut into two
    pieces of at least ``min_size``: the strongest break, then the one nearest the middle, then the
    earliest; -1 where no break leaves both pieces long enough.

    ``cuts_by_strength`` holds, for each strength of `_BY_STRENGTH`, the sorted positions ``p`` where
    a break of that strength cuts (the break after token ``p - 1``).
    """
    low, high = starts + min_size, ends - min_size  # candidate cut positions, inclusive
    twice_middle = starts + ends
    best = np.full(starts.shape, -1, dtype=np.int64)
    for positions in cuts_by_strength:  # a weaker break only where no stronger one is a candidate
        if positions.size == 0:
            continue
        first = np.searchsorted(positions, low, side="left")
        stop = np.searchsorted(positions, high, side="right")  # the candidates: positions[first:stop]
        # The nearest to the middle is the last candidate at or before it (2p <= start + end) or the
        # first one after it; on a tie the earlier one.
        after = np.clip(np.searchsorted(positions, twice_middle // 2, side="right"), first, stop)
        left = positions[np.maximum(after - 1, 0)]
        right = positions[np.minimum(after, positions.size - 1)]
        nearer_left = np.abs(2 * left - twice_middle) <= np.abs(2 * right - twice_middle)
        use_left = (after > first) & ((after == stop) | nearer_left)
        found = (best < 0) & (stop > first)
        best[found] = np.where(use_left, left, right)[found]
    return best


def _even_cuts(start: int, end: int, max_size: int) -> list[int]:
    """The inner bounds of ``[start, end)`` cut into the fewest even pieces of at most ``max_size``,
    the longer ones first."""
    length = end - start
    pieces = math.ceil(length / max_size)
    base, extra = divmod(length, pieces)
    # The first `extra` pieces hold base + 1 tokens, the others base.
    return [start + i * base + min(i, extra) for i in range(1, pieces)]


def _split_long(strengths: np.ndarray, bounds: np.ndarray, min_size: int, max_size: int) -> np.ndarray:
    """``bounds`` (sorted, from 0 to ``n``) with every segment longer than ``max_size`` cut at its best
    break (`_best_cuts`), the pieces again until each fits, or into even pieces (`_even_cuts`) where
    no break fits."""
    cuts_by_strength = [np.flatnonzero(strengths == b) + 1 for b in _BY_STRENGTH]
    found = [bounds]
    starts, ends = bounds[:-1], bounds[1:]
    # Every segment still too long is cut in the same round. A segment's cut depends on its own span
    # only, so cutting round by round gives the cuts that cutting each piece in turn gives.
    while True:
        long = ends - starts > max_size
        if not long.any():
            break
        starts, ends = starts[long], ends[long]
        cuts = _best_cuts(cuts_by_strength, starts, ends, min_size)
        even = cuts < 0
        spans = zip(starts[even].tolist(), ends[even].tolist(), strict=True)
        found.append(np.array([c for a, b in spans for c in _even_cuts(a, b, max_size)], dtype=np.int64))
        cut = ~even
        found.append(cuts[cut])
        starts, ends = np.concatenate([starts[cut], cuts[cut]]), np.concatenate([cuts[cut], ends[cut]])
    return np.sort(np.concatenate(found))


def _chunk_bounds(prompt: Prompt, min_size: int, max_size: int) -> np.ndarray:
    """The bounds of `text_chunks` (int64, sorted, from 0 to ``n``; ``[0]`` for an empty prompt)."""
    n = prompt.n
    if n == 0:
        return np.zeros(1, dtype=np.int64)
    strengths = _strengths(prompt)
    return _split_long(strengths, _section_bounds(strengths, n, min_size), min_size, max_size)


def text_chunks(prompt: Prompt, min_size: int, max_size: int) -> list[int]:
    """The chunk lengths (in prompt order, summing to ``n``) that `StructuredChunks` uses on ``prompt``.

    1. Cut at every message and paragraph break (`Boundary.PARAGRAPH` and stronger): the text's
       own sections.
    2. Merge: a segment shorter than ``min_size`` is joined with the next until the joined one
       reaches ``min_size``; a short rest at the end joins the chunk before it.
    3. Split: a segment longer than ``max_size`` is cut at its best inner break of any kind (the
       strongest `Boundary`, then the one nearest the middle, then the earliest) that leaves both
       pieces at least ``min_size`` long, again until every piece fits; without such a break it is
       cut into even pieces.

    So a section that fits in ``max_size`` stays whole, and a longer one is cut at lines, then
    sentences, into balanced pieces.

    Every chunk has ``min_size`` to ``max_size`` tokens, except the one chunk of a prompt shorter than
    ``min_size`` (`check_chunk_bounds` guarantees the split pieces are long enough).
    """
    lengths: list[int] = np.diff(_chunk_bounds(prompt, min_size, max_size)).tolist()
    return lengths


def _segment_means(values: np.ndarray, chunk_of: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The mean score of each chunk (float64); a chunk holding a -inf score (a NaN from the scorer)
    ranks last, not as NaN."""
    # bincount adds the scores to their chunk's sum one token at a time, in token order: the rounding
    # that torch's index_add_ gives, which these means have always had.
    sums = np.bincount(chunk_of, weights=values.astype(np.float64), minlength=int(lengths.shape[0]))
    return np.nan_to_num(sums / lengths, nan=-math.inf)


@dataclass(frozen=True)
class StructuredChunks:
    """Keep whole chunks that follow the text: sentences, lines, paragraphs and messages.

    The prompt is cut where the text breaks (`boundaries`: where the message or the role changes and
    at blank lines; a section longer than ``max_size`` also at lines, then sentence ends), short
    segments are merged (`text_chunks`), so chunks have ``min_size`` to ``max_size`` tokens. A chunk's score is the mean
    of its tokens' scores; the best chunks are kept, in prompt order.

    The budget comes from ``inner`` (`KeepRate`, `TokenBudget`, `Adaptive`) as a token count, and is
    rounded up to whole chunks as `Chunked` rounds it: chunks are added best first while fewer than
    that many tokens are kept, so the total exceeds the budget by less than one chunk (chunks of
    different lengths make a chunk count meaningless, so ``KeepRate``'s ``ceil(chunks * rate)`` is
    not used). Protected tokens (`Protect`, ``prompt.protected``) count toward the budget as with
    `Chunked`: one token each outside the chosen chunks, and a chunk kept whole by protection is not
    chosen again. A prompt that is one chunk, or that the budget covers, is prefilled whole.

    A prompt without text offsets (`Prompt.from_token_ids`: token ids only) has no text to follow:
    it is selected as ``Chunked(inner, fallback_size)`` does, and the selection's ``reason`` starts
    with ``no text offsets, fixed chunks of <fallback_size>:``.

    The defaults: ``max_size=64``, twice the paper's 32-token window, holds most sentences whole (a
    longer section splits into pieces of about half to all of it) while
    chunks stay small enough for the budget to spread over many places of the prompt (and the budget
    is overshot by less than one chunk); ``min_size=8``, a quarter of it, keeps headers, list
    bullets, short lines and chat-template glue from standing alone, where one outstanding token
    would pick a fragment as if selection were token-level; ``fallback_size=32`` is the paper's window.

    Example::

        Protect(StructuredChunks(KeepRate(0.1)), sink=1, tail=True)
        StructuredChunks(TokenBudget(512), min_size=16, max_size=128)

    Raises:
        InvalidRequestError: ``inner`` is not a budget selector; ``min_size``, ``max_size`` or
            ``fallback_size`` is not an integer >= 1; ``max_size < 2 * min_size - 1``.
    """

    inner: BudgetSelector
    min_size: int = TEXT_CHUNK_MIN_SIZE
    max_size: int = TEXT_CHUNK_MAX_SIZE
    fallback_size: int = 32

    def __post_init__(self) -> None:
        if not isinstance(self.inner, BudgetSelector):
            raise InvalidRequestError(
                "StructuredChunks wraps a budget selector (KeepRate, TokenBudget or Adaptive), got "
                f"{getattr(self.inner, 'name', type(self.inner).__name__)}; to protect tokens write "
                "Protect(StructuredChunks(...)), not StructuredChunks(Protect(...))",
                param="selector",
            )
        check_chunk_bounds(self.min_size, self.max_size)
        check_int(self.fallback_size, "fallback_size", param="fallback_size", minimum=1)

    @property
    def name(self) -> str:
        fallback = f", fallback_size={self.fallback_size}" if self.fallback_size != 32 else ""
        return f"StructuredChunks({self.inner.name}, {self.min_size}, {self.max_size}{fallback})"

    @property
    def _fixed(self) -> Chunked:
        return Chunked(self.inner, self.fallback_size)

    def _fallback_note(self, selection: Selection) -> Selection:
        return replace(selection, reason=f"no text offsets, fixed chunks of {self.fallback_size}: {selection.reason}")

    def chunks(self, prompt: Prompt) -> tuple[tuple[int, int], ...]:
        """The ``(start, end)`` token spans this selector chooses among on ``prompt`` (fixed windows of
        ``fallback_size`` for a prompt without text offsets)."""
        if has_text_offsets(prompt):
            bounds: list[int] = _chunk_bounds(prompt, self.min_size, self.max_size).tolist()
        else:
            size = self.fallback_size
            lengths = [min(size, prompt.n - s) for s in range(0, prompt.n, size)]
            bounds = np.cumsum([0, *lengths]).tolist()
        return tuple(pairwise(bounds))

    def _reason(self, budget: Budget, what: str) -> str:
        return f"text chunks {self.min_size}-{self.max_size} over {budget.reason}: {what}"

    def _whole(self, prompt: Prompt, budget: Budget, forced: np.ndarray) -> Selection | None:
        """The dense selection when the budget covers the prompt, or the prompt is one chunk."""
        if budget.count >= prompt.n:
            return dense_selection(forced, self._reason(budget, "the whole prompt"), requested_rate=budget.rate)
        # A prompt longer than max_size has two chunks at least: no need to cut it here.
        if prompt.n <= self.max_size and len(text_chunks(prompt, self.min_size, self.max_size)) <= 1:
            return dense_selection(forced, self._reason(budget, "one chunk"), requested_rate=budget.rate)
        return None

    def decide_without_scores(self, prompt: Prompt) -> Selection | None:
        """Dense when the inner budget covers the prompt or the prompt is a single chunk."""
        if not has_text_offsets(prompt):
            decided = self._fixed.decide_without_scores(prompt)
            return None if decided is None else self._fallback_note(decided)
        forced = prompt_protected(prompt)
        budget = self.inner.budget(prompt, None, forced)
        return None if budget is None else self._whole(prompt, budget, forced)

    def expected_kept(self, prompt: Prompt) -> int | None:
        """At most the inner budget plus one chunk less one token (or the protected tokens, when more),
        when the inner budget is known without scores."""
        if not has_text_offsets(prompt):
            return self._fixed.expected_kept(prompt)
        estimate = self.inner.expected_kept(prompt)
        if estimate is None:
            return None
        forced = prompt_protected(prompt)
        budget = self.inner.budget(prompt, None, forced)
        count = estimate if budget is None else budget.count
        if count >= prompt.n:
            return prompt.n
        # The last chunk is added while fewer than `count` tokens are kept: it adds max_size at most.
        return min(prompt.n, max(count - 1 + self.max_size, int(forced.sum())))

    def select(self, prompt: Prompt, scores: TokenScores) -> Selection:
        """Keep the best text chunks within the inner selector's budget (plus ``prompt.protected``)."""
        return self.fill(prompt, scores, np.zeros(prompt.n, dtype=bool))

    def fill(self, prompt: Prompt, scores: TokenScores, forced: np.ndarray) -> Selection:
        """Keep ``forced`` and add the best text chunks until the inner budget is reached."""
        if not has_text_offsets(prompt):
            return self._fallback_note(self._fixed.fill(prompt, scores, forced))
        values = score_values(prompt, scores)
        forced = np.asarray(forced, dtype=bool) | prompt_protected(prompt)
        budget = self.inner.budget(prompt, values, forced)
        if budget is None:  # pragma: no cover - every budget is defined once scores are given
            raise RuntimeError(f"{self.inner.name} gave no budget although scores were given")
        whole = self._whole(prompt, budget, forced)
        if whole is not None:
            return whole
        lengths = np.diff(_chunk_bounds(prompt, self.min_size, self.max_size))
        chunk_of = np.repeat(np.arange(int(lengths.shape[0])), lengths)
        means = _segment_means(values, chunk_of, lengths)
        keep, chosen = fill_chunks(means, chunk_of, lengths, lengths, forced, budget.count)
        reason = self._reason(budget, f"{chosen}/{int(lengths.shape[0])} chunks")
        return selection_from_mask(keep, forced, requested_rate=budget.rate, reason=reason)
