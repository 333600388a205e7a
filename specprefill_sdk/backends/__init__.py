"""Backends: where the kept tokens are prefilled and the answer decoded.

``TransformersBackend`` runs a Hugging Face model in-process (exact positions); ``OpenAIBackend``
talks to an OpenAI-compatible HTTP server; ``VLLMBackend`` runs vLLM in-process with the position
plugin. All are imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports
from .base import BackendBase

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {"transformers": ("TransformersBackend", "KVState"), "openai": ("OpenAIBackend",), "vllm": ("VLLMBackend",)},
    eager=("BackendBase",),
)


if TYPE_CHECKING:
    from .openai import OpenAIBackend
    from .transformers import KVState, TransformersBackend
    from .vllm import VLLMBackend
