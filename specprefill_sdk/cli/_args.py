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

__all__ = [
    "DEFAULT_MODEL",
    "add_model_options",
    "keep_rate",
    "non_negative_int",
    "non_negative_number",
    "positive_int",
    "positive_number",
]

T = TypeVar("T")

#: The target of every command when ``--model`` is not given (`specprefill_sdk.models.DEFAULT_MODEL`).
DEFAULT_MODEL = "smollm2-135m"


def add_model_options(parser: argparse.ArgumentParser | argparse._ArgumentGroup, *, compile_help: str = "") -> None:
    """``--model``, ``--draft``, ``--device``, ``--dtype`` and, with ``compile_help``, ``--compile``/``--no-compile``.

    ``args.compile`` is True, False or None (neither given: auto, `ExecutionSettings.compile`).
    """
    parser.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        help=f"target model: a bundled name, a model folder, a .gguf file, a cached hub id (default: {DEFAULT_MODEL})",
    )
    parser.add_argument("--draft", default=None, help="draft model spec (default: the target itself)")
    parser.add_argument("--device", default="auto", help="cpu, cuda, cuda:1 ... (default: auto)")
    parser.add_argument("--dtype", default="auto", help="bfloat16, float16, float32 (default: auto)")
    if compile_help:
        parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None, help=compile_help)


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
