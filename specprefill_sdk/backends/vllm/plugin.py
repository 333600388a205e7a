"""The vLLM plugin: registers model classes whose V2 model runner state applies SpecPrefill positions.

vLLM calls `register` in every process it starts (entry point group ``vllm.general_plugins``), so
it is idempotent and cheap: it only records class paths; vLLM imports them when it builds a model.

Installing the package changes nothing vLLM already serves: by default only new names are
registered (``SpecPrefillLlamaForCausalLM``, ...), which a model uses only when asked for with
``--hf-overrides '{"architectures": ["SpecPrefillLlamaForCausalLM"]}'``. Replacing vLLM's stock
classes (``LlamaForCausalLM``, ``Qwen2ForCausalLM``, ...) is opt-in, through ``SPECPREFILL_VLLM_PLUGIN``:

- unset or empty: the explicit names only;
- ``1``: the explicit names and every stock name in `SUPPORTED_ARCHITECTURES` (a request without a
  layout then runs exactly as before);
- a comma-separated list of stock names (``LlamaForCausalLM,Qwen2ForCausalLM``): those only;
- ``0``: nothing at all (as does vLLM's own ``VLLM_PLUGINS`` filter).

`VLLMBackend` opts in for the engine it starts (`enable_stock_classes`), unless the variable is set.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import os
import threading
from collections.abc import MutableMapping
from dataclasses import dataclass

__all__ = [
    "EXPLICIT_ARCHITECTURES",
    "PLUGIN_SETTING",
    "SUPPORTED_ARCHITECTURES",
    "SUPPORTED_VLLM",
    "RegistrationPlan",
    "check_vllm",
    "enable_stock_classes",
    "plan_registration",
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

#: The environment variable that opts in to the stock names (read in every vLLM process).
PLUGIN_SETTING = "SPECPREFILL_VLLM_PLUGIN"

_OFF = frozenset({"0", "false", "off", "no"})
_ALL = frozenset({"1", "true", "on", "yes", "all"})

_lock = threading.Lock()
#: vLLM architecture names registered in this process so far.
_registered: set[str] = set()


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


@dataclass(frozen=True)
class RegistrationPlan:
    """What `register` does for one value of ``SPECPREFILL_VLLM_PLUGIN``."""

    #: vLLM architecture name -> class name in `specprefill_sdk.backends.vllm.models`; empty: disabled
    names: dict[str, str]
    #: names in the setting that are no stock architecture the plugin covers (ignored, logged)
    unknown: tuple[str, ...] = ()

    @property
    def replaces_stock(self) -> tuple[str, ...]:
        """The stock vLLM names this plan replaces."""
        return tuple(name for name in self.names if name in SUPPORTED_ARCHITECTURES)


def plan_registration(setting: str | None) -> RegistrationPlan:
    """The names to register for a value of ``SPECPREFILL_VLLM_PLUGIN`` (None: unset).

    >>> plan_registration(None).replaces_stock
    ()
    >>> plan_registration("LlamaForCausalLM").replaces_stock
    ('LlamaForCausalLM',)
    """
    value = (setting or "").strip()
    if value.lower() in _OFF:
        return RegistrationPlan(names={})
    names = {name: name for name in EXPLICIT_ARCHITECTURES}
    if value.lower() in _ALL:
        return RegistrationPlan(names={**names, **SUPPORTED_ARCHITECTURES})
    unknown: list[str] = []
    for arch in filter(None, (piece.strip() for piece in value.split(","))):
        if arch in SUPPORTED_ARCHITECTURES:
            names[arch] = SUPPORTED_ARCHITECTURES[arch]
        elif arch not in EXPLICIT_ARCHITECTURES:
            unknown.append(arch)
    return RegistrationPlan(names=names, unknown=tuple(unknown))


def enable_stock_classes(environ: MutableMapping[str, str] | None = None) -> str:
    """Opt in to the stock names for the vLLM processes started from here on; returns the setting in force.

    `VLLMBackend` calls this before it starts an engine: its engine core and workers are child
    processes that inherit the environment, and each runs `register`. A value the user set
    (``0``, a list of names) is kept.
    """
    env = os.environ if environ is None else environ
    if not env.get(PLUGIN_SETTING, "").strip():
        env[PLUGIN_SETTING] = "1"
    return env[PLUGIN_SETTING]


def registered() -> bool:
    """Whether `register` has registered any model class in this process."""
    return bool(_registered)


def register() -> None:
    """Register the SpecPrefill model classes with vLLM's ``ModelRegistry`` (idempotent).

    Which names: see `plan_registration`. A later call after the setting changed (as `VLLMBackend`
    does) registers the names added since. Never raises: vLLM does not guard plugin calls, and an
    exception would stop every model from loading. An unsupported vLLM is logged and leaves vLLM
    untouched.
    """
    plan = plan_registration(os.environ.get(PLUGIN_SETTING))
    if not plan.names:
        logger.info("specprefill: vLLM plugin disabled by %s=0", PLUGIN_SETTING)
        return
    if plan.unknown:
        logger.error(
            "specprefill: %s names %s, which the plugin does not cover (it covers %s); ignored",
            PLUGIN_SETTING,
            ", ".join(plan.unknown),
            ", ".join(SUPPORTED_ARCHITECTURES),
        )
    with _lock:
        todo = {arch: cls for arch, cls in plan.names.items() if arch not in _registered}
        if not todo:
            return
        problem = check_vllm() or _runner_hook_missing()
        if problem:
            logger.error("specprefill: vLLM plugin not registered: %s", problem)
            return
        from vllm import ModelRegistry

        for arch, cls in todo.items():
            ModelRegistry.register_model(arch, f"{_MODELS}:{cls}")
        _registered.update(todo)
        logger.debug("specprefill: registered %s", ", ".join(todo))
