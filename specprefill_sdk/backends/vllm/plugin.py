"""The vLLM plugin: registers model classes whose V2 model runner state applies SpecPrefill positions.

vLLM calls `register` in every process it starts (entry point group ``vllm.general_plugins``), so
it is idempotent and cheap: it only records class paths; vLLM imports them when it builds a model.

Two sets of names are registered:

- the stock architecture names (``LlamaForCausalLM``, ``Qwen2ForCausalLM``, ...), so that
  ``vllm serve <a Llama or Qwen2 model>`` accepts layouts with no other flag; a request without
  layout runs exactly as before. Set ``SPECPREFILL_VLLM_OVERRIDE=0`` to leave them alone;
- explicit names (``SpecPrefillLlamaForCausalLM``, ...), usable with
  ``--hf-overrides '{"architectures": ["SpecPrefillLlamaForCausalLM"]}'`` when the stock names
  are left alone.

``SPECPREFILL_VLLM_PLUGIN=0`` disables the plugin entirely (as does vLLM's ``VLLM_PLUGINS``).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import os
import threading

__all__ = [
    "EXPLICIT_ARCHITECTURES",
    "SUPPORTED_ARCHITECTURES",
    "SUPPORTED_VLLM",
    "check_vllm",
    "register",
    "registered",
    "supported_architecture",
]

logger = logging.getLogger(__name__)

_MODELS = "specprefill_sdk.backends.vllm.models"

#: Stock vLLM architecture name -> our class in `specprefill_sdk.backends.vllm.models`.
SUPPORTED_ARCHITECTURES: dict[str, str] = {
    "LlamaForCausalLM": "SpecPrefillLlamaForCausalLM",
    "LLaMAForCausalLM": "SpecPrefillLlamaForCausalLM",
    "MistralForCausalLM": "SpecPrefillMistralForCausalLM",
    "Qwen2ForCausalLM": "SpecPrefillQwen2ForCausalLM",
    "Qwen3ForCausalLM": "SpecPrefillQwen3ForCausalLM",
}
#: Names that always mean "with SpecPrefill positions".
EXPLICIT_ARCHITECTURES: tuple[str, ...] = tuple(sorted(set(SUPPORTED_ARCHITECTURES.values())))

#: The vLLM releases whose V2 model runner this plugin was built and verified against.
SUPPORTED_VLLM = ((0, 33), (0, 34))  # [lower, upper)

_lock = threading.Lock()
_registered = False


def supported_architecture(architectures: list[str] | tuple[str, ...]) -> str | None:
    """The first of a config's ``architectures`` that this plugin covers, or None."""
    for arch in architectures:
        if arch in SUPPORTED_ARCHITECTURES or arch in EXPLICIT_ARCHITECTURES:
            return arch
    return None


def _version_tuple(version: str) -> tuple[int, int]:
    parts = []
    for piece in version.split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    while len(parts) < 2:
        parts.append(0)
    return parts[0], parts[1]


def check_vllm(version: str | None = None) -> str | None:
    """Why this vLLM cannot host the plugin (a message), or None when it can.

    Checks the release range and that the V2 runner asks models for their own state.
    """
    if version is None:
        try:
            version = importlib.metadata.version("vllm")
        except importlib.metadata.PackageNotFoundError:
            return "vLLM is not installed (pip install 'specprefill-sdk[vllm]')"
    lower, upper = SUPPORTED_VLLM
    if not lower <= _version_tuple(version) < upper:
        return f"vLLM {version} is outside the supported range >={lower[0]}.{lower[1]},<{upper[0]}.{upper[1]}"
    return None


def _runner_hook_missing() -> str | None:
    try:
        module = importlib.import_module("vllm.v1.worker.gpu.model_states")
    except ImportError as exc:
        return f"vLLM has no V2 model runner model states ({exc})"
    resolver = getattr(module, "resolve_model_state_cls", None)
    code = getattr(resolver, "__code__", None)
    if code is None or "get_model_state_cls" not in (*code.co_names, *code.co_consts):
        return "vLLM's V2 model runner does not ask models for their own state (get_model_state_cls)"
    return None


def registered() -> bool:
    """Whether `register` has run successfully in this process."""
    return _registered


def register() -> None:
    """Register the SpecPrefill model classes with vLLM's ``ModelRegistry`` (idempotent).

    Never raises: vLLM does not guard plugin calls, and an exception would stop every model from
    loading. An unsupported vLLM is logged and leaves vLLM untouched.
    """
    global _registered
    if os.environ.get("SPECPREFILL_VLLM_PLUGIN", "1") == "0":
        logger.info("specprefill: vLLM plugin disabled by SPECPREFILL_VLLM_PLUGIN=0")
        return
    with _lock:
        if _registered:
            return
        problem = check_vllm() or _runner_hook_missing()
        if problem:
            logger.error("specprefill: vLLM plugin not registered: %s", problem)
            return
        from vllm import ModelRegistry

        for name in EXPLICIT_ARCHITECTURES:
            ModelRegistry.register_model(name, f"{_MODELS}:{name}")
        if os.environ.get("SPECPREFILL_VLLM_OVERRIDE", "1") != "0":
            for arch, name in SUPPORTED_ARCHITECTURES.items():
                ModelRegistry.register_model(arch, f"{_MODELS}:{name}")
        _registered = True
        logger.debug("specprefill: registered %s", ", ".join(EXPLICIT_ARCHITECTURES))
