"""The cost model behind "never slower than dense": what a prefill and a scoring pass cost on this hardware.

Speculative prefill pays when the draft's scoring pass plus the target's prefill of the kept tokens
takes less time than the target's dense prefill of the whole prompt. Both passes are measured where
they run (`TransformersBackend.warmup`, `DraftAttentionScorer.warmup`, called by `Pipeline.warmup`):
each at a few prompt lengths, fitted as ``a + b*n + c*n^2`` milliseconds (`CostCurve`; the constant
is the per-pass overhead, the look-ahead steps of the scorer among it, the linear term the weights'
work, the square the attention's). `CostModel.decide` compares, for a prompt of ``n`` tokens of
which the selector will keep ``k``::

    score(n) + prefill(k) + overhead  >=  prefill(n)   ->  prefill densely (fallback "slower_than_dense")

``overhead`` is what a compressed request costs beyond its two passes (the selection, the kept
prefill's mask at the original positions, the host's work between the passes); `Pipeline.warmup`
measures it once, end to end, after the curves (`OverheadReport`).

Example::

    model = CostModel(prefill=CostCurve(5.0, 0.02, 0.0), score=CostCurve(40.0, 0.004, 0.0))
    model.decide(1000, kept=100).dense   # True: 44 + 7 ms against 25 ms
    model.decide(8000, kept=800).dense   # False: 72 + 21 ms against 165 ms
"""

from __future__ import annotations

import functools
import itertools
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .errors import InvalidRequestError

logger = logging.getLogger(__name__)

__all__ = [
    "OVERHEAD_MAX_TOKENS",
    "SLOWER_THAN_DENSE",
    "CostCurve",
    "CostDecision",
    "CostModel",
    "OverheadReport",
    "WarmUpReport",
    "best_time_ms",
    "is_cuda",
    "measure_curve",
    "overhead_length",
    "warm_up",
    "warmup_lengths",
    "warmup_token_ids",
]

#: The fallback reason (`Compression.fallback`, ``usage.specprefill.fallback``, the
#: ``specprefill.fallback.reason`` of spans and metrics) when the cost model chose a dense prefill.
SLOWER_THAN_DENSE = "slower_than_dense"

#: The warm-up's prompt lengths on a CUDA device: long enough that every compiled pass compiles
#: (they start at 4M hidden-state elements) and spread so that the fit sees the per-pass overhead,
#: the linear and the quadratic part.
CUDA_LENGTHS = (1024, 4096, 16384)
#: Elsewhere: a CPU's passes cost seconds at a few thousand tokens, so shorter ones.
CPU_LENGTHS = (128, 512, 1024)
#: The longest warm-up length at which `Pipeline.warmup` measures the overhead of a compressed
#: request (`overhead_length`): the overhead is a fixed cost per request, so a mid-sized prompt shows
#: it as well as a long one and costs the warm-up less.
OVERHEAD_MAX_TOKENS = 4096
#: The text the warm-up's prompts repeat (a plain sentence: no template, no special tokens).
WARMUP_SENTENCE = "The keeper of the lighthouse wrote down the wind, the tide and every passing ship. "


@dataclass(frozen=True)
class CostCurve:
    """Milliseconds of one pass over a prompt of ``n`` tokens: ``a + b*n + c*n^2`` (every term >= 0).

    ``points`` are the ``(n, ms)`` measurements it was fitted to (`fit`), if any.
    """

    a: float
    b: float
    c: float
    points: tuple[tuple[int, float], ...] = ()

    def __post_init__(self) -> None:
        for name in ("a", "b", "c"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
                raise InvalidRequestError(f"cost coefficient {name} must be a number >= 0, got {value!r}", param=name)

    def __call__(self, n: int) -> float:
        """The estimated milliseconds for ``n`` tokens (0 for none)."""
        return 0.0 if n <= 0 else self.a + self.b * n + self.c * n * n

    @classmethod
    def fit(cls, points: Sequence[tuple[int, float]]) -> CostCurve:
        """The curve closest to ``(n, ms)`` measurements in relative error, with no negative term.

        Relative error, so that a short prompt's few milliseconds weigh as much as a long one's
        hundreds; each subset of the three terms is fitted and the best one without a negative
        coefficient kept (a non-negative least squares of three unknowns). One point gives a curve
        proportional to ``n`` or a constant, two points the line through them (or the closer of the
        others) when it is non-negative.

        Raises:
            InvalidRequestError: no point, a length below 1, or a time that is negative or not finite.
        """
        pts = [(int(n), float(ms)) for n, ms in points]
        if not pts:
            raise InvalidRequestError("a cost curve needs at least one measurement", param="points")
        for n, ms in pts:
            if n < 1 or not math.isfinite(ms) or ms < 0:
                raise InvalidRequestError(f"a measurement must be (n >= 1, ms >= 0), got {(n, ms)!r}", param="points")
        ns = torch.tensor([n for n, _ in pts], dtype=torch.float64)
        ys = torch.tensor([max(ms, 1e-6) for _, ms in pts], dtype=torch.float64)
        basis = torch.stack([torch.ones_like(ns), ns, ns * ns], dim=1)
        weighted, target = basis / ys[:, None], torch.ones_like(ys)
        best: tuple[float, list[float]] | None = None
        for size in range(1, min(3, len(pts)) + 1):
            for terms in itertools.combinations(range(3), size):
                columns = weighted[:, list(terms)]
                solution = torch.linalg.lstsq(columns, target[:, None]).solution.flatten()
                if bool((solution < 0).any()):
                    continue
                error = float(((columns @ solution - target) ** 2).sum())
                coefficients = [0.0, 0.0, 0.0]
                for term, value in zip(terms, solution.tolist(), strict=True):
                    coefficients[term] = float(value)
                if best is None or error < best[0] - 1e-12:
                    best = (error, coefficients)
        assert best is not None  # the constant alone is never negative
        a, b, c = best[1]
        return cls(a, b, c, points=tuple(pts))

    def describe(self) -> str:
        """``a + b*n + c*n^2 ms`` with the fitted numbers, for logs."""
        return f"{self.a:.3g} + {self.b:.3g}*n + {self.c:.3g}*n^2 ms"


@dataclass(frozen=True)
class CostDecision:
    """What `CostModel.decide` estimated for one prompt, and whether it prefills densely."""

    n: int
    kept: int
    dense_ms: float
    score_ms: float
    kept_ms: float
    #: the per-request overhead of a compressed request (`CostModel.overhead_ms`)
    overhead_ms: float = 0.0

    @property
    def dense(self) -> bool:
        """True when scoring plus the kept prefill plus the overhead would not beat the dense prefill."""
        return self.score_ms + self.kept_ms + self.overhead_ms >= self.dense_ms

    @property
    def reason(self) -> str:
        """The fallback text: ``slower_than_dense: ...`` with the estimates (the overhead when it is not 0)."""
        overhead = f" + overhead {self.overhead_ms:.1f} ms" if self.overhead_ms else ""
        return (
            f"{SLOWER_THAN_DENSE}: scoring {self.score_ms:.1f} ms + prefill of {self.kept} kept tokens "
            f"{self.kept_ms:.1f} ms{overhead} >= dense prefill of {self.n} tokens {self.dense_ms:.1f} ms (estimated)"
        )


@dataclass(frozen=True)
class CostModel:
    """The target's dense prefill (``prefill``) and the draft's scoring (``score``) on this hardware.

    The prefill of ``k`` kept tokens at their original positions costs what a dense prefill of ``k``
    tokens costs (the same pass over fewer tokens), so one curve serves both. ``overhead_ms`` is the
    measured extra cost of one compressed request beyond scoring and the kept prefill (selecting,
    the kept prefill's position ids and mask, the host's work between the passes): a constant per
    request, measured by `Pipeline.warmup` (`OverheadReport`); 0 when not measured.
    """

    prefill: CostCurve
    score: CostCurve
    overhead_ms: float = 0.0

    def __post_init__(self) -> None:
        value = self.overhead_ms
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
            raise InvalidRequestError(f"overhead_ms must be a number >= 0, got {value!r}", param="overhead_ms")

    def decide(self, n: int, kept: int) -> CostDecision:
        """The estimates for a prompt of ``n`` tokens of which ``kept`` would be prefilled."""
        kept = max(0, min(int(kept), int(n)))
        return CostDecision(
            n=int(n),
            kept=kept,
            dense_ms=self.prefill(n),
            score_ms=self.score(n),
            kept_ms=self.prefill(kept),
            overhead_ms=float(self.overhead_ms),
        )


@dataclass(frozen=True)
class OverheadReport:
    """`Pipeline.warmup`'s measurement of the overhead of a compressed request.

    One warm-up prompt of ``n`` tokens ran the compressed path end to end (scoring, selecting,
    the prefill of its ``kept`` tokens, one generated token) in ``request_ms``; the curves estimate
    ``estimated_ms`` for its scoring and kept prefill; ``overhead_ms`` is the rest, at least 0.
    """

    n: int
    kept: int
    request_ms: float
    estimated_ms: float

    @property
    def overhead_ms(self) -> float:
        """``request_ms - estimated_ms``, or 0 when the curves estimate more than the request took."""
        return max(0.0, self.request_ms - self.estimated_ms)


@dataclass(frozen=True)
class WarmUpReport:
    """What one stage's `warmup` did: the seconds it took (compiling included) and the curve it measured."""

    component: str
    seconds: float
    cost: CostCurve
    compiled: bool


def warmup_lengths(device: Any, limit: int, lengths: Sequence[int] | None = None) -> tuple[int, ...]:
    """The prompt lengths a warm-up measures: ``lengths``, or the device's defaults, capped at ``limit``.

    Raises:
        InvalidRequestError: a length that is not an integer >= 1, or ``limit`` below 1.
    """
    if limit < 1:
        raise InvalidRequestError(f"the model's context leaves no room for a warm-up prompt ({limit})")
    if lengths is None:
        lengths = CUDA_LENGTHS if is_cuda(device) else CPU_LENGTHS
    else:
        for n in lengths:
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise InvalidRequestError(f"warm-up lengths must be integers >= 1, got {n!r}", param="lengths")
        if not lengths:
            raise InvalidRequestError("warm-up lengths must not be empty", param="lengths")
    return tuple(sorted({min(int(n), limit) for n in lengths}))


def warmup_token_ids(tokenizer: Any, n: int) -> list[int]:
    """``n`` token ids of `WARMUP_SENTENCE` repeated, as ``tokenizer`` encodes it (no special tokens)."""
    sentence = list(tokenizer.encode(WARMUP_SENTENCE, add_special_tokens=False)) or [0]
    return (sentence * (n // len(sentence) + 1))[:n]


def overhead_length(lengths: Sequence[int], cap: int = OVERHEAD_MAX_TOKENS) -> int | None:
    """The prompt length at which to measure the overhead: the longest of ``lengths`` not above ``cap``.

    When every length is above ``cap``, the shortest of them; None when there is none.
    """
    below = [n for n in lengths if n <= cap]
    if below:
        return max(below)
    return min(lengths, default=None)


def is_cuda(device: Any) -> bool:
    """Whether ``device`` (a `torch.device` or its string) is a CUDA device."""
    return (getattr(device, "type", None) or str(device)).startswith("cuda")


def best_time_ms(run: Callable[[], object], device: Any, *, warm: bool) -> float:
    """The milliseconds ``run()`` takes: one run, or with ``warm`` the faster of two after an untimed one.

    The untimed run is where what compiles, captures a CUDA graph or picks a kernel does it. On a
    CUDA device the clock is read after the device has finished.
    """
    sync = torch.cuda.synchronize if is_cuda(device) else None
    if warm:
        run()
    best = math.inf
    for _ in range(2 if warm else 1):
        if sync is not None:
            sync(device)
        t0 = time.perf_counter()
        run()
        if sync is not None:
            sync(device)
        best = min(best, (time.perf_counter() - t0) * 1000.0)
    return best


def measure_curve(run: Callable[[int], object], lengths: Sequence[int], device: Any, *, warm: bool) -> CostCurve:
    """Time ``run(n)`` at each length (`best_time_ms`) and fit a `CostCurve` to the times.

    ``warm``: run each length once untimed first and keep the faster of two timed runs.
    """
    points = [(int(n), best_time_ms(functools.partial(run, n), device, warm=warm)) for n in lengths]
    return CostCurve.fit(points)


def warm_up(
    component: Any, run: Callable[[int], object], lengths: Sequence[int], device: Any, *, compiled: bool, what: str
) -> WarmUpReport:
    """A stage's warm-up: `measure_curve` over ``lengths`` (warm runs on CUDA), timed whole and logged.

    ``component`` is the stage (its ``repr`` names it in the report and the log line); ``what`` names
    the pass in the log line (``"dense prefill"``, ``"scoring"``).
    """
    started = time.perf_counter()
    cost = measure_curve(run, lengths, device, warm=is_cuda(device))
    report = WarmUpReport(repr(component), time.perf_counter() - started, cost, compiled)
    logger.info(
        "warmed up %s in %.1f s (%s): %s %s",
        component,
        report.seconds,
        "compiled" if compiled else "not compiled",
        what,
        cost.describe(),
    )
    return report
