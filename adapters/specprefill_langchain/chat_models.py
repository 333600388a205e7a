"""`ChatSpecPrefill`: a LangChain chat model that generates through a SpecPrefill `Pipeline`."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any, cast

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LangSmithParams
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, InputTokenDetails, UsageMetadata
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from pydantic import ConfigDict, Field, model_validator

from specprefill_sdk.components import RemoteFields
from specprefill_sdk.errors import InvalidRequestError
from specprefill_sdk.types import Completion, SamplingParams

from ._messages import to_sdk_messages

__all__ = ["ChatSpecPrefill"]

logger = logging.getLogger(__name__)

_CALL_KEYS = frozenset({"max_tokens", "temperature", "top_p", "seed", "stop", "model"})


def _usage(completion: Completion) -> UsageMetadata:
    u = completion.usage
    # InputTokenDetails documents extra provider-specific keys; the kept count is ours.
    details = cast(InputTokenDetails, {"specprefill_kept": u.kept_tokens})
    return UsageMetadata(
        input_tokens=u.prompt_tokens,
        output_tokens=u.completion_tokens,
        total_tokens=u.total_tokens,
        input_token_details=details,
    )


def _specprefill_info(completion: Completion) -> dict[str, Any]:
    u = completion.usage
    return {
        "prompt_tokens": u.prompt_tokens,
        "kept_tokens": u.kept_tokens,
        "keep_ratio": u.keep_ratio,
        "ttft_ms": completion.timings.ttft,
        "score_ms": completion.timings.score,
        "draft": completion.draft,
        "fallback": completion.fallback,
        "reason": completion.selection.reason if completion.selection is not None else None,
    }


class ChatSpecPrefill(RemoteFields, BaseChatModel):
    """A chat model whose prompts are prefilled sparsely: a draft model picks the tokens that matter.

    Runs a `Pipeline`: give one (``pipeline=``), or a policy and a model, in process
    (``model="smollm2-135m"``) or against an OpenAI-compatible server (``base_url=``, e.g. a
    ``specprefill serve``); the draft model always runs here. Streaming and async are native.
    ``response_metadata["specprefill"]`` reports the kept and original prompt tokens, and
    ``usage_metadata["input_token_details"]["specprefill_kept"]`` the kept ones. The fields are those
    of every SpecPrefill component (`specprefill_sdk.components`): ``keep_rate=0.3`` and the other
    policy overrides are fields; an unknown name is refused.

    Example::

        from specprefill_langchain import ChatSpecPrefill

        chat = ChatSpecPrefill(model="smollm2-135m", policy="paper", max_tokens=64)
        reply = chat.invoke([("system", "Answer briefly."), ("human", long_text + "\\nWho wrote this?")])
        reply.content, reply.response_metadata["specprefill"]["keep_ratio"]
    """

    model_config = ConfigDict(populate_by_name=True, arbitrary_types_allowed=True)

    # pipeline, draft, device, dtype, policy, keep_rate and the other policy fields, base_url,
    # api_key, backend_mode: the fields every SpecPrefill component shares (`RemoteFields`).
    model_name: str = Field(default="smollm2-135m", alias="model")
    """The target model: a model spec in process, the server's model id with ``base_url``."""
    temperature: float = 0.0
    max_tokens: int | None = 256
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] | None = Field(default=None, alias="stop_sequences")
    streaming: bool = False
    """Make ``invoke`` stream internally (callbacks then see every token)."""
    timeout: float | None = None
    """Accepted for compatibility with other chat models; requests use the backend's timeout."""
    max_retries: int = 2
    """Accepted for compatibility; the HTTP backend retries on its own."""

    @model_validator(mode="after")
    def _name_from_pipeline(self) -> ChatSpecPrefill:
        if self.pipeline is not None and "model_name" not in self.model_fields_set:
            self.model_name = str(self.pipeline.backend.model_name)
        return self

    @property
    def _llm_type(self) -> str:
        return "specprefill"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {
            "model_name": self.model_name,
            "policy": self.policy,
            "policy_overrides": self.overrides(),
            "base_url": self.base_url,
            "draft": self.draft,
        }

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        params = LangSmithParams(
            ls_provider="specprefill",
            ls_model_type="chat",
            ls_model_name=str(kwargs.get("model") or self.model_name),
            ls_temperature=kwargs.get("temperature", self.temperature),
        )
        max_tokens = kwargs.get("max_tokens", self.max_tokens)
        if max_tokens is not None:
            params["ls_max_tokens"] = max_tokens
        if stop or self.stop:
            params["ls_stop"] = list(stop or self.stop or [])
        return params

    # ------------------------------------------------------------------ plumbing
    @classmethod
    def own_field_names(cls) -> list[str]:
        return ["temperature", "max_tokens", "top_p", "seed", "stop", "streaming", "timeout", "max_retries"]

    @classmethod
    def _names_pipeline(cls, field: str) -> bool:
        return field in ("model", "model_name")  # a chat model's name, also with a ready pipeline

    def target_model(self) -> str:
        return self.model_name

    def get_token_ids(self, text: str) -> list[int]:
        """The ids of ``text`` in the target's tokenizer (what ``get_num_tokens`` counts)."""
        if self.custom_get_token_ids is not None:
            return self.custom_get_token_ids(text)
        return list(self.get_pipeline().backend.tokenizer.encode(text, add_special_tokens=False))

    def get_num_tokens_from_messages(self, messages: list[BaseMessage], tools: Sequence[Any] | None = None) -> int:
        """The prompt tokens of ``messages`` as this model reads them: its chat template applied.

        Raises:
            InvalidRequestError: ``tools`` given (this model does not call tools), or non-text content.
        """
        if tools:
            raise InvalidRequestError("this chat model does not take tools", param="tools")
        return self.get_pipeline().prompt(to_sdk_messages(messages)).n

    def _params(self, stop: list[str] | None, kwargs: dict[str, Any]) -> SamplingParams:
        unknown = sorted(k for k in kwargs if k not in _CALL_KEYS and not k.startswith("ls_"))
        if unknown:
            raise InvalidRequestError(
                f"unsupported argument(s) {', '.join(unknown)}; this model takes {', '.join(sorted(_CALL_KEYS))}"
            )
        requested = kwargs.get("model")
        if requested is not None and requested != self.model_name:
            raise InvalidRequestError(f"this chat model serves {self.model_name!r}, not {requested!r}", param="model")
        stops = list(self.stop or []) + list(stop or []) + list(kwargs.get("stop") or [])
        max_tokens = kwargs.get("max_tokens", self.max_tokens)
        return SamplingParams(
            max_tokens=256 if max_tokens is None else max_tokens,
            temperature=kwargs.get("temperature", self.temperature),
            top_p=kwargs.get("top_p", self.top_p),
            stop=tuple(dict.fromkeys(s for s in stops if s)),
            seed=kwargs.get("seed", self.seed),
        )

    def _metadata(self, completion: Completion) -> dict[str, Any]:
        return {
            "model_name": completion.model or self.model_name,
            "model_provider": "specprefill",
            "finish_reason": completion.finish_reason,
            "specprefill": _specprefill_info(completion),
        }

    def _result(self, completion: Completion) -> ChatResult:
        message = AIMessage(
            content=completion.text, usage_metadata=_usage(completion), response_metadata=self._metadata(completion)
        )
        return ChatResult(
            generations=[ChatGeneration(message=message, generation_info={"finish_reason": completion.finish_reason})],
            llm_output={"model_name": completion.model or self.model_name},
        )

    def _last_chunk(self, completion: Completion | None) -> ChatGenerationChunk:
        if completion is None:  # the stream ended without a final record: still close it properly
            return ChatGenerationChunk(message=AIMessageChunk(content="", chunk_position="last"))
        return ChatGenerationChunk(
            message=AIMessageChunk(
                content="",
                usage_metadata=_usage(completion),
                response_metadata=self._metadata(completion),
                chunk_position="last",
            ),
            generation_info={"finish_reason": completion.finish_reason},
        )

    # ------------------------------------------------------------------ generation
    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        params = self._params(stop, kwargs)
        completion = self.get_pipeline().generate(to_sdk_messages(messages), params)
        return self._result(completion)

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        params = self._params(stop, kwargs)
        completion = await self.get_pipeline().agenerate(to_sdk_messages(messages), params)
        return self._result(completion)

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        params = self._params(stop, kwargs)
        final: Completion | None = None
        for piece in self.get_pipeline().stream(to_sdk_messages(messages), params):
            if piece.text:
                chunk = ChatGenerationChunk(message=AIMessageChunk(content=piece.text))
                if run_manager is not None:
                    run_manager.on_llm_new_token(piece.text, chunk=chunk)
                yield chunk
            if piece.completion is not None:
                final = piece.completion
        yield self._last_chunk(final)

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        params = self._params(stop, kwargs)
        final: Completion | None = None
        async for piece in self.get_pipeline().astream(to_sdk_messages(messages), params):
            if piece.text:
                chunk = ChatGenerationChunk(message=AIMessageChunk(content=piece.text))
                if run_manager is not None:
                    await run_manager.on_llm_new_token(piece.text, chunk=chunk)
                yield chunk
            if piece.completion is not None:
                final = piece.completion
        yield self._last_chunk(final)
