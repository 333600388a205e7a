"""Backends: where the kept tokens are prefilled and the answer decoded.

``TransformersBackend`` runs a Hugging Face model in-process (exact positions); ``OpenAIBackend``
talks to an OpenAI-compatible HTTP server; ``VLLMBackend`` runs vLLM in-process with the position
plugin. All are imported on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .base import BackendBase

__all__ = ["BackendBase", "KVState", "OpenAIBackend", "TransformersBackend", "VLLMBackend"]

_LAZY = {
    "TransformersBackend": ".transformers",
    "KVState": ".transformers",
    "OpenAIBackend": ".openai",
    "VLLMBackend": ".vllm",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


if TYPE_CHECKING:
    from .openai import OpenAIBackend
    from .transformers import KVState, TransformersBackend
    from .vllm import VLLMBackend
