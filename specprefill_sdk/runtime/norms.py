"""RMSNorm as one fused kernel inside the SDK's own forward passes (draft scoring, the backend).

transformers' Llama-style ``RMSNorm`` (Llama, Qwen2, Mistral, SmolLM2, ...) is eight element-wise
kernels: a cast to float32, square, mean, add, rsqrt, multiply, a cast back, and the weight. In a
look-ahead decode step of a small draft, or a short prefill on a GPU, every kernel costs its launch
latency (a few microseconds, even inside a CUDA graph), and the two norms of each layer are about a
third of a decode step's kernels. Inside a pass that asks for it the same function runs as torch's
``rms_norm`` (one fused kernel, computed in float32 and rounded once to the input's dtype, as
transformers does) followed by the weight: two kernels.

`install_fused_norms` gives each such module a subclass whose ``forward`` takes that path only while
`fused_norms` is active in the calling context; at any other time (and in other threads) the module
computes exactly what transformers' own ``forward`` computes. Pickled or deep-copied, a converted
module comes back as its original class. A norm class is converted only after a check on a small
input that both give the same result, so an ``RMSNorm`` with another formula (Gemma's ``1 + weight``)
keeps its own.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["fused_norms", "install_fused_norms"]

_FUSED: contextvars.ContextVar[bool] = contextvars.ContextVar("specprefill_fused_norms", default=False)


@contextlib.contextmanager
def fused_norms(enabled: bool = True) -> Iterator[None]:
    """Norms converted by `install_fused_norms` run fused in this context (this thread or task only).

    ``enabled=False`` makes the context a no-op, so callers with an on/off setting need no branch.
    """
    if not enabled:
        yield
        return
    token = _FUSED.set(True)
    try:
        yield
    finally:
        _FUSED.reset(token)


def fused_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Llama's RMSNorm as torch's fused ``rms_norm`` (float32 inside, one rounding) and then the weight."""
    return weight * F.rms_norm(x, (x.shape[-1],), eps=eps)


def _fused(module: Any, hidden_states: torch.Tensor) -> torch.Tensor:
    return fused_rms_norm(hidden_states, module.weight, module.variance_epsilon)


def _restore(cls: Any, state: dict[str, Any]) -> Any:
    """A module of class ``cls`` with ``state`` (how a converted norm is unpickled or copied)."""
    module = cls.__new__(cls)
    module.__setstate__(state)
    return module


def _candidate(module: Any) -> bool:
    weight = getattr(module, "weight", None)
    return (
        type(module).__name__.endswith("RMSNorm")
        and isinstance(weight, torch.Tensor)
        and weight.dim() == 1
        and isinstance(getattr(module, "variance_epsilon", None), float)
        and not getattr(type(module), "_specprefill_fused", False)
    )


@functools.cache
def _fused_class(cls: Any) -> Any:
    """A subclass of ``cls`` with the switchable fused ``forward``; None when ``cls`` computes something else."""
    probe = cls.__new__(cls)
    torch.nn.Module.__init__(probe)
    generator = torch.Generator().manual_seed(0)
    probe.weight = torch.nn.Parameter(torch.rand(64, generator=generator) + 0.5, requires_grad=False)
    probe.variance_epsilon = 1e-6
    x = torch.randn(3, 5, 64, generator=generator) * 4.0
    try:
        with torch.no_grad():
            same = torch.allclose(cls.forward(probe, x), _fused(probe, x), rtol=1e-5, atol=1e-6)
    except Exception:  # a forward that needs more state than a weight and an epsilon
        return None
    if not same:
        return None

    def forward(self: Any, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if args or kwargs or not _FUSED.get():
            return cls.forward(self, hidden_states, *args, **kwargs)
        return _fused(self, hidden_states)

    def __reduce_ex__(self: Any, protocol: Any) -> Any:
        # Pickled or deep-copied, a converted norm becomes the class it came from: this class exists only
        # in this process, and a copy is a new model that a scorer converts again when it needs to.
        return _restore, (cls, dict(self.__dict__))

    namespace = {"forward": forward, "__reduce_ex__": __reduce_ex__, "__module__": cls.__module__}
    return type(cls.__name__, (cls,), {**namespace, "_specprefill_fused": True})


def install_fused_norms(model: Any) -> int:
    """Convert ``model``'s Llama-style RMSNorm modules in place (idempotent); return how many changed."""
    changed = 0
    for module in model.modules():
        if not _candidate(module):
            continue
        cls: Any = type(module)
        fused = _fused_class(cls)
        if fused is not None:
            module.__class__ = fused
            changed += 1
    return changed
