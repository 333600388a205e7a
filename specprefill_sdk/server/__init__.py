"""The OpenAI-compatible server (``pip install specprefill-sdk[server]``; run ``specprefill serve``).

Example::

    from specprefill_sdk.server import create_app
    app = create_app(model="smollm2-135m", policy="paper", api_key="secret")
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from .app import create_app

        return create_app
    raise AttributeError(f"module 'specprefill_sdk.server' has no attribute {name!r}")


if TYPE_CHECKING:
    from .app import create_app
