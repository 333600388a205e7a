"""vLLM model classes that bring the SpecPrefill position state (imports vLLM).

Each class is the stock vLLM class with one addition: ``get_model_state_cls``, which the V2 model
runner asks for (``vllm/v1/worker/gpu/model_states/__init__.py``). Weights, kernels, quantization
and parallelism are the stock ones.
"""

from __future__ import annotations

import logging
from typing import Any

from vllm.model_executor.models.llama import LlamaForCausalLM
from vllm.model_executor.models.mistral import MistralForCausalLM
from vllm.model_executor.models.qwen2 import Qwen2ForCausalLM
from vllm.model_executor.models.qwen3 import Qwen3ForCausalLM

__all__ = [
    "SpecPrefillLlamaForCausalLM",
    "SpecPrefillMistralForCausalLM",
    "SpecPrefillQwen2ForCausalLM",
    "SpecPrefillQwen3ForCausalLM",
]

logger = logging.getLogger(__name__)


class _SpecPrefillPositions:
    """Mixin: the V2 runner builds `SpecPrefillModelState` for this model."""

    def _specprefill_check_runner(self, vllm_config: Any) -> None:
        if not getattr(vllm_config, "use_v2_model_runner", False):
            logger.warning(
                "specprefill: %s runs on vLLM's V1 model runner, which ignores model states: "
                "requests with SpecPrefill layouts would be prefilled at compact positions. "
                "Unset VLLM_USE_V2_MODEL_RUNNER=0 (or remove what forces the V1 runner).",
                type(self).__name__,
            )

    def get_model_state_cls(self) -> type:
        from .state import SpecPrefillModelState

        return SpecPrefillModelState


class SpecPrefillLlamaForCausalLM(_SpecPrefillPositions, LlamaForCausalLM):
    """Llama family (Llama 2/3/3.1/3.2, SmolLM, TinyLlama, ...) with SpecPrefill positions."""

    def __init__(self, *, vllm_config: Any, prefix: str = "", **kwargs: Any) -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix, **kwargs)
        self._specprefill_check_runner(vllm_config)


class SpecPrefillMistralForCausalLM(_SpecPrefillPositions, MistralForCausalLM):
    """Mistral with SpecPrefill positions."""

    def __init__(self, *, vllm_config: Any, prefix: str = "", **kwargs: Any) -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix, **kwargs)
        self._specprefill_check_runner(vllm_config)


class SpecPrefillQwen2ForCausalLM(_SpecPrefillPositions, Qwen2ForCausalLM):
    """Qwen2 / Qwen2.5 family with SpecPrefill positions."""

    def __init__(self, *, vllm_config: Any, prefix: str = "", **kwargs: Any) -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix, **kwargs)
        self._specprefill_check_runner(vllm_config)


class SpecPrefillQwen3ForCausalLM(_SpecPrefillPositions, Qwen3ForCausalLM):
    """Qwen3 (dense) with SpecPrefill positions."""

    def __init__(self, *, vllm_config: Any, prefix: str = "", **kwargs: Any) -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix, **kwargs)
        self._specprefill_check_runner(vllm_config)
