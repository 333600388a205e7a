"""The OpenAI-compatible server (``pip install specprefill-sdk[server]``; run ``specprefill serve``).

Example::

    from specprefill_sdk.server import ServerConfig, create_app
    app = create_app(ServerConfig(model="smollm2-135m", policy="paper", api_keys=("secret",)))
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

#: Seconds a conversation kept on the server may stay idle before it expires (``--session-ttl``).
DEFAULT_SESSION_TTL = 600.0
#: Conversations kept on the server at once (``--max-sessions``); one more evicts the least recently used.
DEFAULT_MAX_SESSIONS = 32
#: The strategy of a conversation whose first request names none (``--session-strategy``).
DEFAULT_SESSION_STRATEGY = "incremental"
#: The warm-up prompt's length when compiling on a GPU (``--warmup-tokens``): long enough that the
#: draft's prefill and the target's whole prefill of it run their compiled passes (which start at 4M
#: hidden-state elements: 1024 tokens of a 4096-wide model, 4096 of a 1024-wide one).
DEFAULT_WARMUP_TOKENS = 4096


__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {"app": ("create_app",), "config": ("ServerConfig",)},
    eager=("DEFAULT_MAX_SESSIONS", "DEFAULT_SESSION_STRATEGY", "DEFAULT_SESSION_TTL", "DEFAULT_WARMUP_TOKENS"),
)


if TYPE_CHECKING:
    from .app import create_app
    from .config import ServerConfig
