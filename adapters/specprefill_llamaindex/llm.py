"""`SpecPrefillLLM`: a LlamaIndex LLM that generates through a SpecPrefill `Pipeline`."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    ChatResponseAsyncGen,
    ChatResponseGen,
    CompletionResponse,
    CompletionResponseAsyncGen,
    CompletionResponseGen,
    LLMMetadata,
    MessageRole,
)
from llama_index.core.bridge.pydantic import Field
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback
from llama_index.core.llms.custom import CustomLLM

from specprefill_sdk.components import RemoteFields
from specprefill_sdk.errors import InvalidRequestError
from specprefill_sdk.prompt import PromptInput
from specprefill_sdk.types import Completion, Message, SamplingParams

__all__ = ["SpecPrefillLLM"]

logger = logging.getLogger(__name__)

_CALL_KEYS = frozenset({"max_tokens", "temperature", "top_p", "seed", "stop", "formatted"})
_ROLES = {
    MessageRole.DEVELOPER: "system",
    MessageRole.FUNCTION: "tool",
    MessageRole.CHATBOT: "assistant",
    MessageRole.MODEL: "assistant",
}


def _info(completion: Completion) -> dict[str, Any]:
    u = completion.usage
    return {
        "prompt_tokens": u.prompt_tokens,
        "kept_tokens": u.kept_tokens,
        "completion_tokens": u.completion_tokens,
        "keep_ratio": u.keep_ratio,
        "ttft_ms": completion.timings.ttft,
        "finish_reason": completion.finish_reason,
        "fallback": completion.fallback,
        "reason": completion.selection.reason if completion.selection is not None else None,
    }


def _raw(completion: Completion | None) -> dict[str, Any] | None:
    """``raw`` of a response: OpenAI-style ``usage`` (what `TokenCountingHandler` reads) and our report."""
    if completion is None:
        return None
    u = completion.usage
    usage = {
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.total_tokens,
        "kept_tokens": u.kept_tokens,
    }
    return {"usage": usage, "specprefill": _info(completion)}


def _sdk_message(message: ChatMessage) -> Message:
    role = _ROLES.get(message.role, message.role.value)
    texts = []
    for block in message.blocks:
        if getattr(block, "block_type", None) != "text":
            raise InvalidRequestError("only text content is supported by this model", param="messages")
        texts.append(str(getattr(block, "text", "")))
    return Message(role=role, content="".join(texts))


class SpecPrefillLLM(RemoteFields, CustomLLM):
    """An LLM whose prompts are prefilled sparsely: a draft model picks the tokens that matter.

    Chat goes through the model's chat template; ``complete`` wraps the prompt as one user message
    (``complete_as_chat=True``, for instruction-tuned models) or sends it as plain text. Streaming
    and async are native. ``additional_kwargs["specprefill"]`` reports kept and original tokens.

    Example::

        from specprefill_llamaindex import SpecPrefillLLM

        llm = SpecPrefillLLM(model="smollm2-135m", policy="paper", max_tokens=64)
        print(llm.complete(long_text + "\\nWho wrote this?").text)
    """

    # pipeline, draft, device, dtype, policy, keep_rate and the other policy fields, base_url,
    # api_key, backend_mode: the fields every SpecPrefill component shares (`RemoteFields`).
    model: str = Field(
        default="smollm2-135m", description="The target model spec (the server's model id with base_url)."
    )
    max_tokens: int = Field(default=256, ge=1, description="Tokens to generate at most.")
    temperature: float = Field(default=0.0, ge=0.0, description="0 is greedy.")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    seed: int | None = None
    complete_as_chat: bool = Field(default=True, description="complete() sends the prompt as a user message.")

    @classmethod
    def class_name(cls) -> str:
        return "SpecPrefillLLM"

    @classmethod
    def own_field_names(cls) -> list[str]:
        return ["max_tokens", "temperature", "top_p", "seed", "complete_as_chat"]

    def get_token_ids(self, text: str) -> list[int]:
        """The ids of ``text`` in the target's tokenizer: ``TokenCountingHandler(tokenizer=llm.get_token_ids)``."""
        return list(self.get_pipeline().backend.tokenizer.encode(text, add_special_tokens=False))

    @property
    def metadata(self) -> LLMMetadata:
        backend = self.get_pipeline().backend
        return LLMMetadata(
            context_window=backend.max_context,
            num_output=self.max_tokens,
            is_chat_model=True,
            model_name=backend.model_name,
        )

    def _params(self, kwargs: dict[str, Any]) -> SamplingParams:
        unknown = sorted(set(kwargs) - _CALL_KEYS)
        if unknown:
            raise InvalidRequestError(
                f"unsupported argument(s) {', '.join(unknown)}; this LLM takes {', '.join(sorted(_CALL_KEYS))}"
            )
        stop = kwargs.get("stop") or ()
        return SamplingParams(
            max_tokens=kwargs.get("max_tokens", self.max_tokens),
            temperature=kwargs.get("temperature", self.temperature),
            top_p=kwargs.get("top_p", self.top_p),
            seed=kwargs.get("seed", self.seed),
            stop=(stop,) if isinstance(stop, str) else tuple(stop),
        )

    def _prompt(self, prompt: str) -> PromptInput:
        return [Message("user", prompt)] if self.complete_as_chat else prompt

    # ------------------------------------------------------------------ completion
    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        completion = self.get_pipeline().generate(self._prompt(prompt), self._params(kwargs))
        return CompletionResponse(
            text=completion.text, raw=_raw(completion), additional_kwargs={"specprefill": _info(completion)}
        )

    @llm_completion_callback()
    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseGen:
        params = self._params(kwargs)
        pipeline = self.get_pipeline()

        def gen() -> CompletionResponseGen:
            text = ""
            for piece in pipeline.stream(self._prompt(prompt), params):
                text += piece.text
                extra = {"specprefill": _info(piece.completion)} if piece.completion is not None else {}
                yield CompletionResponse(
                    text=text, delta=piece.text, raw=_raw(piece.completion), additional_kwargs=extra
                )

        return gen()

    @llm_completion_callback()
    async def acomplete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        completion = await self.get_pipeline().agenerate(self._prompt(prompt), self._params(kwargs))
        return CompletionResponse(
            text=completion.text, raw=_raw(completion), additional_kwargs={"specprefill": _info(completion)}
        )

    @llm_completion_callback()
    async def astream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseAsyncGen:
        params = self._params(kwargs)
        pipeline = self.get_pipeline()

        async def gen() -> CompletionResponseAsyncGen:
            text = ""
            async for piece in pipeline.astream(self._prompt(prompt), params):
                text += piece.text
                extra = {"specprefill": _info(piece.completion)} if piece.completion is not None else {}
                yield CompletionResponse(
                    text=text, delta=piece.text, raw=_raw(piece.completion), additional_kwargs=extra
                )

        return gen()

    # ------------------------------------------------------------------ chat
    @staticmethod
    def _chat_response(text: str, completion: Completion | None, delta: str | None = None) -> ChatResponse:
        extra = {"specprefill": _info(completion)} if completion is not None else {}
        return ChatResponse(
            message=ChatMessage(role=MessageRole.ASSISTANT, content=text),
            delta=delta,
            raw=_raw(completion),
            additional_kwargs=extra,
        )

    @llm_chat_callback()
    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        completion = self.get_pipeline().generate([_sdk_message(m) for m in messages], self._params(kwargs))
        return self._chat_response(completion.text, completion)

    @llm_chat_callback()
    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        params = self._params(kwargs)
        sdk = [_sdk_message(m) for m in messages]
        pipeline = self.get_pipeline()

        def gen() -> ChatResponseGen:
            text = ""
            for piece in pipeline.stream(sdk, params):
                text += piece.text
                yield self._chat_response(text, piece.completion, piece.text)

        return gen()

    @llm_chat_callback()
    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        completion = await self.get_pipeline().agenerate([_sdk_message(m) for m in messages], self._params(kwargs))
        return self._chat_response(completion.text, completion)

    @llm_chat_callback()
    async def astream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseAsyncGen:
        params = self._params(kwargs)
        sdk = [_sdk_message(m) for m in messages]
        pipeline = self.get_pipeline()

        async def gen() -> ChatResponseAsyncGen:
            text = ""
            async for piece in pipeline.astream(sdk, params):
                text += piece.text
                yield self._chat_response(text, piece.completion, piece.text)

        return gen()
