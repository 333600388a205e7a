"""Wall-clock intervals in milliseconds, as every stage reports them."""

from __future__ import annotations

import time

__all__ = ["elapsed_ms"]


def elapsed_ms(start: float, end: float | None = None) -> float:
    """Milliseconds from ``start`` to ``end`` (default: now), both `time.perf_counter` readings."""
    return ((time.perf_counter() if end is None else end) - start) * 1000.0
