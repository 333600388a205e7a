"""Argument types for argparse, built on the library's own checks (`specprefill_sdk.validation`).

A bad value becomes argparse's one-line usage error, e.g. ``argument --keep: keep rate must be in
(0, 1], got 1.5``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TypeVar

from ..errors import InvalidRequestError
from ..validation import check_float, check_int, check_rate

__all__ = ["keep_rate", "non_negative_int", "non_negative_number", "positive_int", "positive_number"]

T = TypeVar("T")


def _argument(parse: Callable[[str], object], check: Callable[[object], T], name: str) -> Callable[[str], T]:
    def convert(text: str) -> T:
        try:
            value: object = parse(text)
        except ValueError:
            value = text  # the check names the text it could not read
        try:
            return check(value)
        except InvalidRequestError as exc:
            raise argparse.ArgumentTypeError(exc.message.strip()) from None  # "argument --x: must be ..."

    convert.__name__ = name
    return convert


keep_rate = _argument(float, lambda v: check_rate(v, "keep rate", param="keep_rate"), "keep rate")
positive_int = _argument(int, lambda v: check_int(v, "", param="value", minimum=1), "integer")
non_negative_int = _argument(int, lambda v: check_int(v, "", param="value", minimum=0), "integer")
non_negative_number = _argument(float, lambda v: check_float(v, "", param="value"), "number")
positive_number = _argument(float, lambda v: check_float(v, "", param="value", inclusive=False), "number")
