"""litellm integration of specprefill-sdk (install ``specprefill-sdk[litellm]``).

`SpecPrefillCallback` shortens chat prompts for any model behind litellm (text mode) or forwards the
``specprefill`` extension to deployments served by ``specprefill serve``. Proxy ``config.yaml``::

    litellm_settings:
      callbacks: specprefill_callbacks.handler   # a module next to config.yaml: handler = SpecPrefillCallback(...)

SDK::

    import litellm
    from specprefill_litellm import SpecPrefillCallback

    litellm.callbacks = [SpecPrefillCallback(policy="paper", keep_rate=0.3)]
    await litellm.acompletion(model="openai/gpt-4o-mini", messages=[...])
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = ["SpecPrefillCallback"]


def __getattr__(name: str) -> Any:
    if name != "SpecPrefillCallback":
        raise AttributeError(f"module 'specprefill_litellm' has no attribute {name!r}")
    value = importlib.import_module(".callback", __name__).SpecPrefillCallback
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


if TYPE_CHECKING:
    from .callback import SpecPrefillCallback
