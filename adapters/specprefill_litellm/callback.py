"""`SpecPrefillCallback`: a litellm callback that shortens chat prompts on their way to any model.

Two ways, chosen per model:

- text mode (any provider): the messages are scored by a local draft model and each keeps the
  characters of its kept tokens; the provider receives shorter messages.
- pass-through (deployments that are a ``specprefill serve`` server, or anything that speaks our
  ``specprefill`` extension): the request is sent unchanged with ``extra_body={"specprefill": ...}``
  and the server prefills the kept tokens at their original positions.

In the litellm proxy the work happens in ``async_pre_call_hook``; with the litellm SDK
(``litellm.callbacks = [handler]``, async calls) in ``async_pre_call_deployment_hook``, which also
sees the deployment's ``api_base``. Both hooks are defined on this class itself: the proxy only runs
a ``async_pre_call_hook`` found in the callback's own class, so subclasses get them re-attached.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Collection, Mapping
from typing import Any

from litellm.integrations.custom_logger import CustomLogger

from specprefill_sdk.errors import InvalidRequestError
from specprefill_sdk.pipeline import Pipeline
from specprefill_sdk.policies import resolve_pipeline
from specprefill_sdk.textmode import compress_messages
from specprefill_sdk.types import Message

__all__ = ["SpecPrefillCallback"]

logger = logging.getLogger(__name__)

_CHAT_CALLS = frozenset({"completion", "acompletion"})
#: Marks a request already compressed in text mode (in its ``metadata``), so no hook does it twice.
MARKER = "specprefill"


def _call_name(call_type: Any) -> str:
    return str(getattr(call_type, "value", call_type) or "")


def _base(url: Any) -> str:
    text = str(url or "").rstrip("/")
    return text[: -len("/v1")] if text.endswith("/v1") else text


def _text_of(content: Any) -> str | None:
    """The text of an OpenAI message content: a string, or text parts only; None otherwise."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, Mapping) or part.get("type") != "text":
                return None
            texts.append(str(part.get("text", "")))
        return "".join(texts)
    return None


class SpecPrefillCallback(CustomLogger):
    """Shortens chat prompts (text mode) or forwards the ``specprefill`` extension to our servers.

    Example (a module next to the proxy's ``config.yaml``, named in ``litellm_settings.callbacks``)::

        from specprefill_litellm import SpecPrefillCallback

        handler = SpecPrefillCallback(policy="paper", keep_rate=0.3, server_models=["smollm2"])
    """

    def __init__(
        self,
        pipeline: Pipeline | None = None,
        *,
        model: str = "smollm2-135m",
        policy: str = "paper",
        server_models: Collection[str] = (),
        server_api_bases: Collection[str] = (),
        options: Mapping[str, Any] | None = None,
        text_models: Collection[str] | None = None,
        roles: Collection[str] | None = None,
        gap: str = " ",
        **policy_overrides: Any,
    ) -> None:
        """Args:
        pipeline: scores text-mode prompts; default: ``policy`` over ``model``, loaded on first use.
        server_models: model names (proxy model groups or SDK model strings) served by a
            specprefill server: their requests carry the ``specprefill`` extension instead.
        server_api_bases: deployment URLs of specprefill servers (matched in the deployment hook).
        options: the ``specprefill`` object sent to servers, e.g. ``{"policy": "paper", "keep_rate": 0.2}``;
            a request's own ``specprefill`` fields win.
        text_models: compress only these models in text mode; None: every model not served by us.
        roles: compress only messages with these roles; None: all (the policy's protections hold).
        gap: put where text was dropped.
        policy_overrides: policy fields for the text-mode pipeline, e.g. ``keep_rate=0.3``.
        """
        super().__init__()
        if isinstance(server_models, str) or isinstance(server_api_bases, str):
            raise InvalidRequestError("server_models and server_api_bases are lists of names")
        self._pipeline = pipeline
        self.model = model
        self.policy = policy
        self.server_models = frozenset(server_models)
        self.server_api_bases = frozenset(_base(u) for u in server_api_bases)
        self.options = dict(options or {})
        self.text_models = None if text_models is None else frozenset(text_models)
        self.roles = None if roles is None else frozenset(roles)
        self.gap = gap
        self.policy_overrides = dict(policy_overrides)
        self._lock = threading.Lock()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # The proxy runs async_pre_call_hook only when the callback's own class defines it.
        super().__init_subclass__(**kwargs)
        for name in ("async_pre_call_hook", "async_pre_call_deployment_hook"):
            if name not in vars(cls):
                setattr(cls, name, getattr(SpecPrefillCallback, name))

    def get_pipeline(self) -> Pipeline:
        """The pipeline that scores text-mode prompts (loaded on first use)."""
        with self._lock:
            if self._pipeline is None:
                self._pipeline = resolve_pipeline(
                    None, policy=self.policy, model=self.model, overrides=self.policy_overrides
                )
            return self._pipeline

    # ------------------------------------------------------------------ the two ways
    def _pass_through(self, data: dict[str, Any]) -> dict[str, Any]:
        extra = dict(data.get("extra_body") or {})
        own = data.pop("specprefill", None)  # a client's extension arrives as a top-level field
        requested = {**(extra.get("specprefill") or {}), **(own or {})}
        extra["specprefill"] = {**self.options, **requested}
        data["extra_body"] = extra
        return data

    def _compressible(self, model: str) -> bool:
        return self.text_models is None or model in self.text_models

    def compress(self, data: dict[str, Any]) -> dict[str, Any]:
        """Text mode: shorten ``data["messages"]`` (OpenAI format); other fields stay as they are."""
        messages = data.get("messages")
        metadata = data.get("metadata")
        if not isinstance(messages, list) or not messages:
            return data
        if isinstance(metadata, Mapping) and MARKER in metadata:
            return data
        texts = [_text_of(m.get("content")) if isinstance(m, Mapping) else None for m in messages]
        keep = [
            i
            for i, (m, t) in enumerate(zip(messages, texts, strict=True))
            if t is None or (self.roles is not None and str(m.get("role")) not in self.roles)
        ]
        if len(keep) == len(messages) or not any(t and t.strip() for t in texts):
            return data
        sdk = [
            Message(role=str(m.get("role") or "user") if isinstance(m, Mapping) else "user", content=t or "")
            for m, t in zip(messages, texts, strict=True)
        ]
        result = compress_messages(self.get_pipeline(), sdk, keep_whole=keep, gap=self.gap)
        out = []
        for i, (message, part) in enumerate(zip(messages, result.parts, strict=True)):
            if i in keep or part is None or not part.dropped:
                out.append(message)
            else:
                out.append({**message, "content": part.text})
        stats = {
            "prompt_tokens": result.prompt_tokens,
            "kept_tokens": result.kept_tokens,
            "keep_ratio": round(result.keep_ratio, 4),
        }
        logger.info("text mode: %d of %d prompt tokens kept", result.kept_tokens, result.prompt_tokens)
        data["messages"] = out
        data["metadata"] = {**(metadata if isinstance(metadata, Mapping) else {}), MARKER: stats}
        return data

    # ------------------------------------------------------------------ litellm hooks
    async def async_pre_call_hook(
        self, user_api_key_dict: Any, cache: Any, data: dict[str, Any], call_type: Any
    ) -> dict[str, Any]:
        """Proxy hook: pass the extension to specprefill servers, shorten the messages for the others."""
        if _call_name(call_type) not in _CHAT_CALLS:
            return data
        model = str(data.get("model") or "")
        if model in self.server_models:
            return self._pass_through(data)
        if not self._compressible(model):
            return data
        return await asyncio.to_thread(self._compress_or_pass, data)

    async def async_pre_call_deployment_hook(self, kwargs: dict[str, Any], call_type: Any) -> dict[str, Any] | None:
        """SDK hook, once the deployment is known: the same, matching servers by ``api_base`` too."""
        if call_type is not None and _call_name(call_type) not in _CHAT_CALLS:
            return None
        if MARKER in (kwargs.get("extra_body") or {}):
            return None  # the proxy hook already chose the pass-through
        model = str(kwargs.get("model") or "")
        served = model in self.server_models or (
            bool(self.server_api_bases) and _base(kwargs.get("api_base")) in self.server_api_bases
        )
        if served:
            return self._pass_through(kwargs)
        if not self._compressible(model):
            return None
        return await asyncio.to_thread(self._compress_or_pass, kwargs)

    def _compress_or_pass(self, data: dict[str, Any]) -> dict[str, Any]:
        # Compression only saves time: a request it cannot handle goes out unchanged, never fails.
        try:
            return self.compress(data)
        except Exception as exc:
            logger.warning("text mode skipped for this request: %s: %s", type(exc).__name__, exc)
            return data
