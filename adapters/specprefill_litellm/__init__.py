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

from typing import TYPE_CHECKING

from specprefill_sdk._lazy import lazy_exports, require_extra

require_extra(__name__, "litellm", ("litellm",))

__getattr__, __dir__, __all__ = lazy_exports(__name__, {"callback": ("SpecPrefillCallback",)})


if TYPE_CHECKING:
    from .callback import SpecPrefillCallback
