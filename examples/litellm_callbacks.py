"""The callback module that examples/litellm_config.yaml names (``callbacks: litellm_callbacks.handler``).

The litellm proxy imports it from the config file's folder. ``smollm2`` is served by
``specprefill serve``: its requests carry the ``specprefill`` extension and the server prefills the
kept tokens at their positions. Every other model gets text mode: a local draft model shortens the
messages before they leave the proxy.
"""

from __future__ import annotations

from specprefill_litellm import SpecPrefillCallback

handler = SpecPrefillCallback(
    model="smollm2-135m",  # the draft that scores text-mode prompts (loaded on the first one)
    policy="paper",
    keep_rate=0.3,  # text mode keeps 30%, and so does the server for `smollm2` (its `specprefill` object)
    server_models=["smollm2"],
)
