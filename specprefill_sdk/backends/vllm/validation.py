"""Reject malformed layouts when ``vllm serve`` admits a request (HTTP 400), not later in the worker.

The worker cannot fail one request without stopping the engine, so a layout it cannot use is logged
and the request runs at vanilla positions. To fail such requests at admission instead, start the
server with this class as a logits processor of the V2 model runner::

    vllm serve <model> --logits-processors specprefill_sdk.backends.vllm.validation:LayoutValidator

vLLM then calls `LayoutValidator.validate_params` in the API process for every request; a
``ValueError`` becomes a 400 response with vLLM's error body. The processor never changes logits:
`LayoutValidator.add_request` declines every request, so the sampler does not call it.

What it checks is what the request alone tells: the version, ``specprefill_n``, and spans or
positions that are integers, sorted, inside ``[0, n)`` and not overlapping. Whether the layout
places as many tokens as the prompt has, and whether ``n`` fits ``max_model_len``, is still checked
in the worker (with the vanilla-positions fallback), because the prompt is not known at this point.

It is not registered through vLLM's ``vllm.logits_processors`` entry point: vLLM loads every
processor registered there into every engine, including V1-runner engines, which reject V2
processors at start-up.
"""

from __future__ import annotations

from typing import Any

from ...errors import InvalidRequestError
from .layout import PositionLayout, has_layout

__all__ = ["LayoutValidator", "check_layout"]

try:  # vLLM >= 0.33 (V2 model runner); the module is import-light by design (no torch, no CUDA).
    from vllm.v1.worker.gpu.sample.logits_processor.interface import (
        LogitsProcessor as _LogitsProcessor,  # type: ignore[import-not-found,unused-ignore]
    )
except ImportError:  # vLLM missing: the class still documents and tests the check
    _LogitsProcessor = object


def check_layout(extra_args: Any) -> None:
    """Raise ``ValueError`` for a malformed SpecPrefill layout in a request's ``extra_args``.

    Requests without a layout pass unchanged.
    """
    if not has_layout(extra_args):
        return
    try:
        PositionLayout.from_extra_args(extra_args)
    except InvalidRequestError as exc:
        raise ValueError(f"invalid SpecPrefill layout: {exc.message}") from exc


class LayoutValidator(_LogitsProcessor):  # type: ignore[misc,valid-type,unused-ignore]
    """A V2 logits processor that only validates SpecPrefill layouts at request admission."""

    def __init__(self, vllm_config: Any = None, req_states: Any = None) -> None:
        pass

    @classmethod
    def validate_params(cls, sampling_params: Any) -> None:
        """Called by vLLM's input processor for each request; raises ``ValueError`` on a bad layout."""
        check_layout(getattr(sampling_params, "extra_args", None))

    def add_request(self, req_idx: int, sampling_params: Any) -> bool:
        """Decline every request: logits are never changed."""
        return False

    def apply(self, logits: Any, ctx: Any) -> Any:
        """Identity (never called for a declined request)."""
        return logits
