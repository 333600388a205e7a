"""`SpecPrefillMiddleware`: LangChain 1.x agent middleware that shortens messages before every model call."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection
from typing import Any, cast

try:
    from langchain.agents.middleware import AgentMiddleware, ModelRequest, ModelResponse
except ModuleNotFoundError as exc:  # langchain-core alone has no agents
    raise ModuleNotFoundError(
        f"SpecPrefillMiddleware needs langchain 1.x ({exc.name} is missing): pip install 'specprefill-sdk[langchain]'",
        name=exc.name,
    ) from exc
from langchain_core.messages import AIMessage, AnyMessage, BaseMessage, SystemMessage

from specprefill_sdk.components import PipelineSettings
from specprefill_sdk.pipeline import Pipeline

from ._messages import compress_langchain_messages

__all__ = ["SpecPrefillMiddleware"]

logger = logging.getLogger(__name__)

ModelCallResult = ModelResponse[Any] | AIMessage


class SpecPrefillMiddleware(AgentMiddleware[Any, Any, Any]):
    """Compress the conversation (text mode) each time an agent calls its model; any chat model.

    The agent's state keeps the full history; only the request the model sees is shortened. By
    default the system message stays whole and the policy's selector decides the rest (tool
    results, long user turns). Compression runs in a worker thread for async agents.

    Example::

        from langchain.agents import create_agent
        from specprefill_langchain import SpecPrefillMiddleware

        agent = create_agent(model="openai:gpt-4o-mini", tools=[search],
                             middleware=[SpecPrefillMiddleware(policy="paper", keep_rate=0.3)])
    """

    def __init__(
        self,
        pipeline: Pipeline | None = None,
        *,
        roles: Collection[str] | None = None,
        compress_system: bool = False,
        gap: str = " ",
        **settings: Any,
    ) -> None:
        """Args:
        pipeline: a ready pipeline; otherwise ``policy`` over ``model`` (built on first use).
        roles: compress only messages with these roles (``user``, ``assistant``, ``tool``); None: all.
        compress_system: also compress the system message.
        gap: put where text was dropped.
        settings: the fields every SpecPrefill component shares (`specprefill_sdk.components`):
            ``model``, ``draft``, ``device``, ``dtype``, ``policy``, ``keep_rate`` and the other
            policy overrides, ``policy_overrides``.

        Raises:
            InvalidRequestError: an unknown name (the message names the closest field).
            PolicyError: a bad policy or override value.
        """
        super().__init__()
        if pipeline is not None:
            settings["pipeline"] = pipeline
        self.settings = PipelineSettings(
            component=type(self).__name__, own=("roles", "compress_system", "gap"), **settings
        )
        self.roles = None if roles is None else frozenset(roles)
        self.compress_system = compress_system
        self.gap = gap

    def get_pipeline(self) -> Pipeline:
        """The pipeline that scores the messages."""
        return self.settings.get_pipeline()

    def compress_request(self, request: ModelRequest[Any]) -> ModelRequest[Any]:
        """The request with its messages (and, if asked, its system message) shortened."""
        system = request.system_message
        messages: list[BaseMessage] = ([system] if system is not None else []) + list(request.messages)
        keep = {0} if system is not None and not self.compress_system else set()
        out, result = compress_langchain_messages(
            self.get_pipeline(), messages, roles=self.roles, keep=keep, gap=self.gap
        )
        if result is None:
            return request
        logger.debug("agent model call: %d of %d prompt tokens kept", result.kept_tokens, result.prompt_tokens)
        if system is not None:
            new_system = out[0]
            assert isinstance(new_system, SystemMessage)
            return request.override(system_message=new_system, messages=cast(list[AnyMessage], out[1:]))
        return request.override(messages=cast(list[AnyMessage], out))

    def wrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], ModelResponse[Any]],
    ) -> ModelCallResult:
        """Shorten the request, then call the model."""
        return handler(self.compress_request(request))

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> ModelCallResult:
        """Async form: the draft model runs in a worker thread."""
        shorter = await asyncio.to_thread(self.compress_request, request)
        return await handler(shorter)
