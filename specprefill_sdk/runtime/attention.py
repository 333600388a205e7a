"""Which attention runs: SDPA's kernel order during the SDK's passes, and the hooked implementation names.

`DraftAttentionScorer` switches its draft to ``specprefill_sdpa`` (or ``specprefill_eager``), an
attention implementation registered with transformers that delegates to the plain ``sdpa`` (or
``eager``) one; the forward passes computed from a model's weights (`specprefill_sdk.runtime.lean`)
need to know which plain implementation a hooked model delegates to (`base_implementation`).

`sdpa_context` restricts torch's scaled-dot-product attention to some kernels, in an order of
preference, for the duration of a pass (``ExecutionSettings.attention_backends``).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..errors import InvalidRequestError

if TYPE_CHECKING:
    import torch

__all__ = [
    "DEFAULT_ATTENTION_BACKENDS",
    "HOOKED_IMPLEMENTATIONS",
    "SDPA_KERNELS",
    "base_implementation",
    "check_attention_backends",
    "sdpa_context",
    "settle_sdpa_order",
]

#: SDPA kernels by name, for ``ExecutionSettings(attention_backends=...)``: name -> `SDPBackend` member
SDPA_KERNELS = {
    "cudnn": "CUDNN_ATTENTION",
    "flash": "FLASH_ATTENTION",
    "efficient": "EFFICIENT_ATTENTION",
    "math": "MATH",
}
DEFAULT_ATTENTION_BACKENDS: tuple[str, ...] = tuple(SDPA_KERNELS)
#: the kernels that take an attention mask: a compiled look-ahead step attends over a masked cache
MASKED_KERNELS = ("cudnn", "efficient", "math")

#: the prefix of the attention implementations that the draft-attention hook registers
HOOKED_PREFIX = "specprefill_"
#: implementations the hook can wrap (the base it delegates to) -> the registered name
HOOKED_IMPLEMENTATIONS = {"sdpa": HOOKED_PREFIX + "sdpa", "eager": HOOKED_PREFIX + "eager"}


def base_implementation(model: Any) -> str:
    """The implementation a hooked model delegates to (``sdpa`` or ``eager``), else its own."""
    current = str(model.config._attn_implementation)
    return current.removeprefix(HOOKED_PREFIX) if current in HOOKED_IMPLEMENTATIONS.values() else current


def check_attention_backends(value: Sequence[str] | None) -> tuple[str, ...] | None:
    """``value`` checked and as a tuple of `SDPA_KERNELS` names (a single name is a sequence of one).

    Raises:
        InvalidRequestError: an empty sequence, an unknown name, or no kernel that takes a mask
            (`MASKED_KERNELS`: the scorer's compiled look-ahead steps need one; flash takes none).
    """
    if value is None:
        return None
    if isinstance(value, str):
        value = (value,)
    try:
        names = tuple(value)
    except TypeError:
        names = ()
    unknown = [n for n in names if n not in SDPA_KERNELS]
    if not names or unknown:
        raise InvalidRequestError(
            f"attention_backends must be a non-empty sequence of {', '.join(SDPA_KERNELS)}; got {value!r}",
            param="attention_backends",
        )
    if not any(n in MASKED_KERNELS for n in names):
        raise InvalidRequestError(
            f"attention_backends {names!r} has no kernel that takes an attention mask, which the draft's "
            f"look-ahead steps attend with; name one of {', '.join(MASKED_KERNELS)} too",
            param="attention_backends",
        )
    return names


@functools.cache
def _sdpa_takes_priority() -> bool:
    """Whether this torch's `sdpa_kernel` orders the kernels it is given (``set_priority``)."""
    from torch.nn.attention import sdpa_kernel

    return "set_priority" in inspect.signature(sdpa_kernel).parameters


_sdpa_order_ready: set[int] = set()


def settle_sdpa_order(device: torch.device) -> None:
    """Let torch choose its own SDPA kernel order on ``device`` before anyone saves and restores it.

    torch fixes its order lazily, at the first attention call of the process (cuDNN first on Hopper
    and Blackwell GPUs, flash first elsewhere). An ``sdpa_kernel(..., set_priority=True)`` context
    entered before that call saves the uninitialised order (flash first) and restores it on exit, so
    every later attention call in the process runs flash instead of cuDNN, which is slower on those
    GPUs (docs/benchmarks.md). One tiny attention call settles the order first; it runs once per device.
    """
    import torch

    if device.type != "cuda" or not torch.cuda.is_available():
        return
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index in _sdpa_order_ready:
        return
    q = torch.zeros(1, 1, 1, 64, dtype=torch.bfloat16, device=device)
    with torch.inference_mode():
        torch.nn.functional.scaled_dot_product_attention(q, q, q)
    _sdpa_order_ready.add(index)


def sdpa_context(names: tuple[str, ...] | None, device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """SDPA restricted to ``names`` in that order of preference (CUDA only; elsewhere nothing changes)."""
    if names is None or device.type != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = [getattr(SDPBackend, SDPA_KERNELS[n]) for n in names]
    if _sdpa_takes_priority():
        settle_sdpa_order(device)
        return sdpa_kernel(backends, set_priority=True)
    return sdpa_kernel(backends)
