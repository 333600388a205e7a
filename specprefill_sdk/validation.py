"""Checks of user-given numbers, written once: selectors, the server and the command line call them.

Each check returns the value (as its type) or raises `InvalidRequestError` with a message that names
the value and the rule, e.g. ``keep rate must be in (0, 1], got 1.5``; ``param`` names the field of a
request that carried it.

Example::

    check_rate(0.2, "keep_rate", param="keep_rate")          # 0.2
    check_int(0, "max_tokens", param="max_tokens", minimum=1)  # raises InvalidRequestError
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from .errors import InvalidRequestError

__all__ = [
    "TEXT_CHUNK_MAX_SIZE",
    "TEXT_CHUNK_MIN_SIZE",
    "check_choice",
    "check_chunk_bounds",
    "check_float",
    "check_int",
    "check_known",
    "check_rate",
]

#: The default bounds of text chunks (`selection.StructuredChunks`, which says why these), kept
#: here so that a policy checks its bounds without importing the selectors.
TEXT_CHUNK_MIN_SIZE = 8
TEXT_CHUNK_MAX_SIZE = 64


def check_rate(value: object, what: str, *, param: str, allow_zero: bool = False) -> float:
    """Validate a rate in (0, 1] (or [0, 1] with ``allow_zero``) and return it as a float."""
    low = "[0" if allow_zero else "(0"
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidRequestError(f"{what} must be a number in {low}, 1], got {value!r}", param=param)
    if value > 1 or value < 0 or (value == 0 and not allow_zero):
        raise InvalidRequestError(f"{what} must be in {low}, 1], got {value!r}", param=param)
    return float(value)


def check_int(value: object, what: str, *, param: str, minimum: int) -> int:
    """Validate an integer >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidRequestError(f"{what} must be an integer >= {minimum}, got {value!r}", param=param)
    return value


def check_chunk_bounds(
    min_size: object, max_size: object, *, names: tuple[str, str] = ("min_size", "max_size")
) -> tuple[int, int]:
    """Validate the bounds of variable chunks: integers >= 1 with ``max_size >= 2 * min_size - 1``.

    The relation lets a segment longer than ``max_size`` always split into pieces of at least
    ``min_size`` (its halves are), so every chunk of a prompt of ``min_size`` tokens or more lies
    within the bounds. ``names`` are the two settings as the caller spells them (also the ``param``).
    """
    low = check_int(min_size, names[0], param=names[0], minimum=1)
    high = check_int(max_size, names[1], param=names[1], minimum=1)
    if high < 2 * low - 1:
        raise InvalidRequestError(
            f"{names[1]} ({high}) must be at least 2 * {names[0]} - 1 ({2 * low - 1}), so that a longer "
            f"segment splits into pieces of at least {names[0]}",
            param=names[1],
        )
    return low, high


def check_float(value: object, what: str, *, param: str, minimum: float = 0.0, inclusive: bool = True) -> float:
    """Validate a finite number >= ``minimum`` (> ``minimum`` when not ``inclusive``) as a float."""
    bound = f"{'>=' if inclusive else '>'} {minimum:g}"
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidRequestError(f"{what} must be a finite number {bound}, got {value!r}", param=param)
    if value < minimum or (value == minimum and not inclusive):
        raise InvalidRequestError(f"{what} must be a finite number {bound}, got {value!r}", param=param)
    return float(value)


def check_choice(value: object, choices: Sequence[str], name: str) -> str:
    """``value`` when it is one of ``choices``; raises `InvalidRequestError` (param ``name``) otherwise."""
    if not isinstance(value, str) or value not in choices:
        raise InvalidRequestError(f"{name} must be one of {', '.join(choices)}; got {value!r}", param=name)
    return value


def check_known(
    names: Iterable[str],
    known: Sequence[str],
    what: str,
    valid: str,
    *,
    error: type[InvalidRequestError] = InvalidRequestError,
) -> None:
    """Refuse names outside ``known``: the message names the unknown ones (``what``) and lists ``valid`` ones."""
    unknown = sorted(set(names) - set(known))
    if unknown:
        raise error(
            f"unknown {what}{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
            f"valid {valid}: {', '.join(known)}",
            param=unknown[0],
        )
