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
from collections.abc import AsyncGenerator, Collection, Mapping
from typing import Any

from litellm.integrations.custom_logger import CustomLogger

from specprefill_sdk.components import PipelineSettings
from specprefill_sdk.errors import InvalidRequestError
from specprefill_sdk.pipeline import Pipeline
from specprefill_sdk.textmode import compress_messages
from specprefill_sdk.types import Message

__all__ = ["SpecPrefillCallback"]

logger = logging.getLogger(__name__)

_CHAT_CALLS = frozenset({"completion", "acompletion"})
#: Marks a request already compressed in text mode (in its ``metadata``), so no hook does it twice.
MARKER = "specprefill"


#: The policy overrides a specprefill server's ``specprefill`` object takes, by their names there.
_WIRE_NAMES = {
    "keep_rate": "keep_rate",
    "token_budget": "token_budget",
    "chunk_size": "chunk_size",
    "look_ahead": "look_ahead",
    "pool_kernel": "pool_kernel",
    "layers": "layers",
    "dense_below_tokens": "min_prompt_tokens",
    "sink": "sink",
    "roles": "roles",
    "last_user_turn": "last_user_turn",
    "special_tokens": "special_tokens",
}


def _wire_options(settings: PipelineSettings) -> dict[str, Any]:
    """The ``specprefill`` object that asks a server for what ``settings`` ask of text mode."""
    out: dict[str, Any] = {}
    if "policy" in settings.model_fields_set:
        out["policy"] = settings.policy
    for key, value in settings.overrides().items():
        if key in _WIRE_NAMES:
            out[_WIRE_NAMES[key]] = list(value) if isinstance(value, tuple) else value
        elif key == "tail" and isinstance(value, bool):
            out["tail"] = value
    return out


def _stream_report(chunks: Any) -> Any:
    """The last ``usage.specprefill`` among a litellm stream's kept chunks, or None."""
    for chunk in reversed(chunks if isinstance(chunks, list) else []):
        usage = getattr(chunk, "usage", None)
        report = getattr(usage, MARKER, None) if usage is not None else None
        if report is not None:
            return report
    return None


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


#: The sync-call warning is shown once per process: litellm copies callbacks, so no instance can keep it.
_SYNC_WARNED = False

#: Hooks the proxy runs only when they are in the callback class's own ``__dict__``.
_OWN_HOOKS = (
    "async_pre_call_hook",
    "async_pre_call_deployment_hook",
    "async_post_call_response_headers_hook",
    "async_post_call_streaming_iterator_hook",
)


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
        server_models: Collection[str] = (),
        server_api_bases: Collection[str] = (),
        options: Mapping[str, Any] | None = None,
        text_models: Collection[str] | None = None,
        roles: Collection[str] | None = None,
        gap: str = " ",
        **settings: Any,
    ) -> None:
        """Args:
        pipeline: scores text-mode prompts; default: ``policy`` over ``model``, loaded on first use.
        server_models: model names (proxy model groups or SDK model strings) served by a
            specprefill server: their requests carry the ``specprefill`` extension instead.
        server_api_bases: deployment URLs of specprefill servers (matched in the deployment hook).
        options: the ``specprefill`` object sent to servers, e.g. ``{"policy": "paper", "keep_rate": 0.2}``;
            by default the ``policy`` and policy fields given here (``keep_rate=0.3`` keeps 30%
            either way); these options win over them, a request's own ``specprefill`` fields over both.
        text_models: compress only these models in text mode; None: every model not served by us.
        roles: compress only messages with these roles; None: all (the policy's protections hold).
        gap: put where text was dropped.
        settings: the fields every SpecPrefill component shares (`specprefill_sdk.components`):
            ``model``, ``draft``, ``device``, ``dtype``, ``policy``, ``keep_rate`` and the other
            policy overrides, ``policy_overrides``.

        Raises:
            InvalidRequestError: an unknown name (the message names the closest field).
            PolicyError: a bad policy or override value.
        """
        super().__init__()
        if isinstance(server_models, str) or isinstance(server_api_bases, str):
            raise InvalidRequestError("server_models and server_api_bases are lists of names")
        if pipeline is not None:
            settings["pipeline"] = pipeline
        own = ("server_models", "server_api_bases", "options", "text_models", "roles", "gap")
        self.settings = PipelineSettings(component=type(self).__name__, own=own, **settings)
        self.server_models = frozenset(server_models)
        self.server_api_bases = frozenset(_base(u) for u in server_api_bases)
        self.options = {**_wire_options(self.settings), **(options or {})}
        self.text_models = None if text_models is None else frozenset(text_models)
        self.roles = None if roles is None else frozenset(roles)
        self.gap = gap

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # The proxy runs async_pre_call_hook only when the callback's own class defines it.
        super().__init_subclass__(**kwargs)
        for name in _OWN_HOOKS:
            if name not in vars(cls):
                setattr(cls, name, getattr(SpecPrefillCallback, name))

    def get_pipeline(self) -> Pipeline:
        """The pipeline that scores text-mode prompts (loaded on first use)."""
        return self.settings.get_pipeline()

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
        before = dict(metadata) if isinstance(metadata, Mapping) else {}
        spend = before.get("spend_logs_metadata")
        # spend_logs_metadata is what litellm copies into the standard logging payload and spend logs.
        before["spend_logs_metadata"] = {**(spend if isinstance(spend, Mapping) else {}), MARKER: stats}
        data["metadata"] = {**before, MARKER: stats}
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

    async def async_post_call_response_headers_hook(
        self,
        data: dict[str, Any],
        user_api_key_dict: Any,
        response: object,
        request_headers: dict[str, str] | None = None,
        litellm_call_info: dict[str, object] | None = None,
    ) -> dict[str, str] | None:
        """Proxy hook: text mode's counts as response headers (``x-specprefill-kept-tokens`` etc.)."""
        metadata = data.get("metadata")
        stats = metadata.get(MARKER) if isinstance(metadata, Mapping) else None
        if not isinstance(stats, Mapping):
            return None
        return {f"x-specprefill-{key.replace('_', '-')}": str(value) for key, value in stats.items()}

    async def async_post_call_streaming_iterator_hook(
        self, user_api_key_dict: Any, response: Any, request_data: dict[str, Any]
    ) -> AsyncGenerator[Any, None]:
        """Proxy hook: a stream's final usage keeps the server's ``usage.specprefill``.

        litellm rebuilds a stream's usage from its standard counts only; the chunks it kept
        (``response.chunks``) still hold the server's report, which is put back on the usage chunk.
        """
        async for item in response:
            usage = getattr(item, "usage", None)
            if usage is not None and getattr(usage, MARKER, None) is None:
                report = _stream_report(getattr(response, "chunks", None))
                if report is not None:
                    setattr(usage, MARKER, report)
            yield item

    def log_pre_api_call(self, model: Any, messages: Any, kwargs: Any) -> None:
        """Warn once that a sync ``litellm.completion`` goes out unchanged: litellm runs no pre-call hook there."""
        global _SYNC_WARNED
        if _SYNC_WARNED or not isinstance(kwargs, Mapping) or _call_name(kwargs.get("call_type")) != "completion":
            return
        params = kwargs.get("litellm_params")
        metadata = params.get("metadata") if isinstance(params, Mapping) else None
        if isinstance(metadata, Mapping) and MARKER in metadata:
            return  # already compressed (e.g. by the proxy hook)
        _SYNC_WARNED = True
        logger.warning(
            "SpecPrefillCallback: sync litellm.completion runs no pre-call hook, so its prompts go out "
            "uncompressed (this warning is shown once per process); use litellm.acompletion or the litellm proxy"
        )

    def _compress_or_pass(self, data: dict[str, Any]) -> dict[str, Any]:
        # Compression only saves time: a request it cannot handle goes out unchanged, never fails.
        try:
            return self.compress(data)
        except Exception as exc:
            logger.warning("text mode skipped for this request: %s: %s", type(exc).__name__, exc)
            return data
