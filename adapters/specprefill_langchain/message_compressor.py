"""`SpecPrefillMessageCompressor`: a `Runnable` that shortens chat messages for any chat model (text mode)."""

from __future__ import annotations

import asyncio
from typing import Any

from langchain_core.language_models import LanguageModelInput
from langchain_core.messages import BaseMessage
from langchain_core.runnables import RunnableConfig, RunnableSerializable
from pydantic import ConfigDict

from specprefill_sdk.components import PipelineFields

from ._messages import as_messages, compress_langchain_messages

__all__ = ["SpecPrefillMessageCompressor"]


class SpecPrefillMessageCompressor(PipelineFields, RunnableSerializable[LanguageModelInput, list[BaseMessage]]):
    """Shorten the messages of a prompt before a chat model reads them; put it in front of any model.

    The pipeline's draft model scores the conversation and its selector keeps tokens (the policy's
    protections hold, e.g. the last user turn); each message keeps the characters of its kept
    tokens, and its type, id, name and tool calls. Messages with non-text content stay whole.
    Takes a string, a prompt value or messages; returns messages.

    Example::

        from specprefill_langchain import SpecPrefillMessageCompressor

        chain = prompt_template | SpecPrefillMessageCompressor(policy="paper") | ChatOpenAI(model="gpt-4o-mini")
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    # pipeline, draft, device, dtype, policy, keep_rate and the other policy fields: the fields
    # every SpecPrefill component shares (`PipelineFields`).
    model: str = "smollm2-135m"
    """The model whose tokenizer and draft score the messages (when no pipeline is given)."""
    roles: list[str] | None = None
    """Compress only messages with these roles (``user``, ``assistant``, ``system``, ``tool``); None: all."""
    gap: str = " "

    @classmethod
    def own_field_names(cls) -> list[str]:
        return ["roles", "gap"]

    def _compress(self, value: LanguageModelInput) -> list[BaseMessage]:
        messages = as_messages(value)
        out, _ = compress_langchain_messages(self.get_pipeline(), messages, roles=self.roles, gap=self.gap)
        return out

    def invoke(
        self, input: LanguageModelInput, config: RunnableConfig | None = None, **kwargs: Any
    ) -> list[BaseMessage]:
        """Return ``input`` as messages whose text is shortened."""
        return self._call_with_config(self._compress, input, config, run_type="prompt")

    async def ainvoke(
        self, input: LanguageModelInput, config: RunnableConfig | None = None, **kwargs: Any
    ) -> list[BaseMessage]:
        """Async `invoke`: the draft model runs in a worker thread."""

        async def run(value: LanguageModelInput) -> list[BaseMessage]:
            return await asyncio.to_thread(self._compress, value)

        return await self._acall_with_config(run, input, config, run_type="prompt")
