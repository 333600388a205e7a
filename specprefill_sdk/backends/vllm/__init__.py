"""SpecPrefill on vLLM: a plugin that gives vLLM's V2 model runner original RoPE positions per request,
and `VLLMBackend`, the in-process backend built on it.

- `register` is the ``vllm.general_plugins`` entry point (model classes with the position state);
- `PositionLayout` is the request encoding (``SamplingParams.extra_args`` / ``vllm_xargs``);
- `VLLMBackend` wraps ``vllm.LLM`` for the target.

Importing this package does not import vLLM; `VLLMBackend` does when it starts an engine.
"""

from __future__ import annotations

from .backend import VLLMBackend
from .layout import (
    KEY_N,
    KEY_POSITIONS,
    KEY_SPANS,
    KEY_VERSION,
    PositionLayout,
    encode_prompt,
    has_layout,
    vllm_completion_body,
)
from .parallel import DevicePlan, plan_devices
from .plugin import SUPPORTED_ARCHITECTURES, register

__all__ = [
    "KEY_N",
    "KEY_POSITIONS",
    "KEY_SPANS",
    "KEY_VERSION",
    "SUPPORTED_ARCHITECTURES",
    "DevicePlan",
    "PositionLayout",
    "VLLMBackend",
    "encode_prompt",
    "has_layout",
    "plan_devices",
    "register",
    "vllm_completion_body",
]
