"""Wire formats of the server: OpenAI request/response shapes plus the ``specprefill`` extension.

OpenAI clients send the extension with ``extra_body``::

    client.chat.completions.create(model="smollm2-135m", messages=[...],
                                   extra_body={"specprefill": {"keep_rate": 0.2, "look_ahead": 4}})

Top-level request objects ignore unknown OpenAI fields (clients add new ones often), but every
field that would change the answer and that this server cannot honour (``n`` > 1, ``tool_choice``
``"required"``, ``response_format`` JSON modes, ``logit_bias``, ...) is declared and refused with a
400 naming it (``code: unsupported_parameter``); the ``specprefill`` object forbids unknown fields, so
a typo is an error rather than silently ignored. ``tools`` (for models whose chat template renders
them), ``logprobs`` and ``top_logprobs`` are served.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from ..types import MAX_LOGPROBS, Aggregation

__all__ = [
    "CHAT_ROLES",
    "ChatChoice",
    "ChatCompletion",
    "ChatCompletionChunk",
    "ChatCompletionRequest",
    "ChatLogprobs",
    "ChatMessage",
    "ChunkChoice",
    "CompletionChoice",
    "CompletionLogprobs",
    "CompletionRequest",
    "ContentPart",
    "ConversationCapability",
    "ConversationDeleted",
    "ConversationMessage",
    "ConversationObject",
    "ConversationTurn",
    "ConversationUsage",
    "DeltaMessage",
    "DeltaToolCall",
    "DetokenizeRequest",
    "DetokenizeResponse",
    "ErrorDetail",
    "ErrorResponse",
    "HealthResponse",
    "ModelCard",
    "ModelList",
    "ScoringQueueReport",
    "SpecPrefillCapability",
    "SpecPrefillOptions",
    "SpecPrefillUsage",
    "StreamOptions",
    "TextCompletion",
    "TextCompletionChunk",
    "TokenLogprobInfo",
    "TokenizeRequest",
    "TokenizeResponse",
    "ToolCallFunction",
    "ToolCallObject",
    "ToolDefinition",
    "ToolFunction",
    "TopLogprob",
    "UsageInfo",
    "WarmUpReport",
]

#: The pydantic error type of text that is not valid Unicode; the server answers it with 400.
UNENCODABLE_TEXT = "unencodable_text"
#: The pydantic error type of a field this server does not serve with the value given (400).
UNSERVED_FIELD = "unserved_field"


def _encodable(text: str) -> str:
    # A lone surrogate ("\\ud800" in JSON) is a Python str but no text: refuse it here, before a
    # tokenizer or chat template fails on it.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise PydanticCustomError(
            UNENCODABLE_TEXT,
            "not valid Unicode text: a lone surrogate at character {at}",
            {"at": exc.start},
        ) from None
    return text


def _refuse(refused: Callable[[Any], bool], message: str) -> AfterValidator:
    """Refuse the values ``refused`` picks out: ignoring them would answer another question than asked."""

    def check(value: Any) -> Any:
        if value is not None and refused(value):
            raise PydanticCustomError(UNSERVED_FIELD, message)
        return value

    return AfterValidator(check)


_TOOL_CHOICE_REFUSED = (
    "not served: only 'auto' and 'none' are; this server does not constrain decoding, so it cannot force a call "
    "('required') or a named function; send 'auto' (the model decides) or 'none'"
)
#: ``tool_choice`` / ``function_call`` values that force no call.
_NO_CALL = ("none", "auto")


#: Client text that may reach a tokenizer, a chat template or a log: valid Unicode only.
Text = Annotated[str, AfterValidator(_encodable)]

#: A stop string: non-empty.
StopString = Annotated[Text, Field(min_length=1)]

#: Conversation ids: letters, digits and ``_ . : -`` (they appear in URLs).
CONVERSATION_ID_PATTERN = r"^[A-Za-z0-9_.:-]+$"

#: Upper bound of token lists on the wire (prompt ids, position ids): far above any context we serve.
MAX_WIRE_TOKENS = 1 << 20


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")


# ----------------------------------------------------------------------------- the extension
class SpecPrefillOptions(_Strict):
    """Per-request control of speculative prefill (the ``specprefill`` object of a request body).

    Types are strict: ``"enabled": "no"`` or ``"look_ahead": true`` is a 400, not a guess.
    Unset fields keep the server's policy. ``prompt_token_ids`` + ``position_ids`` send a prompt
    that is already compressed: it is prefilled exactly at those positions, without scoring.
    """

    model_config = ConfigDict(extra="forbid", strict=True)

    enabled: bool = Field(True, description="False: dense prefill of the whole prompt, no draft model.")
    policy: Text | None = Field(
        None,
        min_length=1,
        max_length=100,
        description="A policy preset by name (see GET /v1/models); default: the server's.",
    )
    keep_rate: float | None = Field(None, gt=0.0, le=1.0, description="Share of prompt tokens to keep.")
    token_budget: int | None = Field(None, ge=1, description="Keep this many tokens instead of a rate.")
    chunk_size: int | None = Field(None, ge=1, le=4096, description="Select chunks of this many tokens.")
    look_ahead: int | None = Field(
        None, ge=1, le=64, description="Draft look-ahead tokens whose attention scores the prompt."
    )
    pool_kernel: int | None = Field(None, ge=1, le=257, description="Smoothing kernel of the scores (odd).")
    layers: int | None = Field(
        None, ge=1, le=1024, description="Score with the draft's first N layers only (needs look_ahead 1)."
    )
    layer_share: float | None = Field(
        None,
        gt=0,
        le=1,
        description="Score with the first round(layer_share x depth) of the draft's layers (needs look_ahead 1).",
    )
    aggregation: Aggregation | None = Field(
        None,
        description="How the draft's attention rows are reduced over layers and heads: max (the paper's), mean, "
        "content-mean (the attention sink and the local window left out; keeps shallow layers accurate) "
        "or last-layer (only the deepest scored layer votes).",
    )
    min_prompt_tokens: int | None = Field(
        None, ge=0, description="Dense prefill below this prompt length (the policy's dense_below_tokens)."
    )
    sink: int | None = Field(None, ge=0, le=1024, description="Always keep this many leading tokens.")
    tail: bool | None = Field(None, description="Always keep the generation prompt at the end.")
    roles: list[Annotated[Text, Field(min_length=1, max_length=64)]] | None = Field(
        None, max_length=16, description="Always keep every token of messages with these roles."
    )
    last_user_turn: bool | None = Field(None, description="Always keep the last user message.")
    special_tokens: bool | None = Field(None, description="Always keep special/template tokens.")
    prompt_token_ids: list[int] | None = Field(
        None,
        min_length=1,
        max_length=MAX_WIRE_TOKENS,
        description="Pre-compressed prompt: the kept token ids (needs position_ids).",
    )
    position_ids: list[int] | None = Field(
        None,
        min_length=1,
        max_length=MAX_WIRE_TOKENS,
        description="Pre-compressed prompt: the original position of each kept id, strictly increasing.",
    )
    prompt_length: int | None = Field(
        None, ge=1, description="Pre-compressed prompt: the original length n (default: last position + 1)."
    )
    return_token_ids: bool = Field(False, description="Add the generated token ids to each choice.")
    return_kept_positions: bool = Field(
        False,
        description="Add usage.specprefill.kept_positions: the prompt positions the target prefilled (not with a "
        "pre-compressed prompt, whose positions are those sent, nor in a conversation; a stream needs "
        "stream_options.include_usage).",
    )
    conversation_id: str | None = Field(
        None,
        min_length=1,
        max_length=200,
        pattern=CONVERSATION_ID_PATTERN,
        description="A conversation kept on the server: with conversation_start, the id to give it; "
        "without, the conversation to continue (send only the new user message).",
    )
    conversation_start: bool = Field(
        False,
        description="Start a conversation kept on the server: messages are its whole first turn; the "
        "answer's usage.specprefill.conversation.id names it (conversation_id, or a new id).",
    )
    conversation_strategy: Literal["recompute", "incremental", "refresh"] | None = Field(
        None,
        description="How a conversation treats tokens earlier turns dropped (set at its start; default incremental).",
    )

    @model_validator(mode="after")
    def _pairs(self) -> SpecPrefillOptions:
        if (self.prompt_token_ids is None) != (self.position_ids is None):
            raise ValueError("prompt_token_ids and position_ids go together: give both or neither")
        if self.return_kept_positions and self.precompressed:
            raise ValueError(
                "return_kept_positions with a pre-compressed prompt: its kept positions are the position_ids sent"
            )
        if self.return_kept_positions and self.conversational:
            raise ValueError(
                "return_kept_positions is not served in a conversation: usage.specprefill.conversation reports "
                "each turn"
            )
        return self

    @property
    def conversational(self) -> bool:
        """Whether the request starts or continues a conversation kept on the server."""
        return self.conversation_start or self.conversation_id is not None or self.conversation_strategy is not None

    @property
    def precompressed(self) -> bool:
        return self.prompt_token_ids is not None

    def overrides(self) -> dict[str, Any]:
        """The policy fields this request sets (for ``Policy.with_overrides``)."""
        keys = (
            "keep_rate",
            "token_budget",
            "chunk_size",
            "look_ahead",
            "pool_kernel",
            "layers",
            "layer_share",
            "aggregation",
            "min_prompt_tokens",
            "sink",
            "tail",
            "roles",
            "last_user_turn",
            "special_tokens",
        )
        out: dict[str, Any] = {}
        for key in keys:
            value = getattr(self, key)
            if value is not None:
                out[key] = tuple(value) if isinstance(value, list) else value
        return out


class ConversationUsage(BaseModel):
    """What a turn of a conversation kept on the server did (``usage.specprefill.conversation``)."""

    id: str = Field(description="The conversation's id: send it as specprefill.conversation_id next time.")
    strategy: str
    turn: int = Field(description="This turn's number (1 for the turn that started it).")
    messages: int = Field(description="Messages in the conversation after this turn, its answer included.")
    prefilled_tokens: int = Field(description="Prompt tokens the target prefilled in this turn.")
    reused_tokens: int = Field(description="Kept tokens reused from the cache of earlier turns.")
    evicted_tokens: int = Field(description="Cached tokens this turn removed.")
    draft_tokens: int = Field(description="Tokens the draft read in this turn (0 when none were scored).")


class SpecPrefillUsage(BaseModel):
    """What speculative prefill did for one request (``usage.specprefill``)."""

    kept_tokens: int = Field(description="Prompt tokens the target prefilled (for a conversation: holds).")
    keep_ratio: float = Field(description="kept_tokens / prompt_tokens.")
    score_ms: float = Field(description="Draft scoring time in milliseconds (0 when no scoring ran).")
    prefill_ms: float = Field(description="Target prefill time in milliseconds.")
    select_ms: float | None = Field(None, description="Selecting the kept tokens from the scores, in milliseconds.")
    ttft_ms: float | None = Field(
        None, description="The pipeline's time to the first token: from its call (after tokenizing) to that token."
    )
    admit_ms: float | None = Field(
        None,
        description="From the request's arrival to its admission: reading and validating the body, the wait for a "
        "slot, in milliseconds.",
    )
    tokenize_ms: float | None = Field(
        None,
        description="Tokenizing the prompt into its Prompt (chat template, roles; a chat prompt's token offsets, "
        "while a text prompt's are computed when a step first reads them), in milliseconds.",
    )
    queue_ms: float | None = Field(
        None, description="Waiting in the scoring queue before the draft began (part of score_ms); null: no queue."
    )
    submit_ms: float | None = Field(
        None, description="Building the engine's request and handing it over (part of prefill_ms); null: none."
    )
    server_ms: float | None = Field(
        None,
        description="From the request's arrival (before its body was read) to its first token's chunk (streamed) "
        "or to its answer (not streamed), in milliseconds.",
    )
    host_ms: float | None = Field(
        None, description="server_ms - score_ms - prefill_ms: the server's time around the two model steps."
    )
    fallback: str | None = Field(None, description="Why the request fell back to dense prefill, or null.")
    reason: str | None = Field(None, description="How the kept tokens were chosen, e.g. 'dense below 256 tokens'.")
    kept_positions: list[int] | None = Field(
        None,
        description="With specprefill.return_kept_positions: the positions (from 0, in the prompt) of the tokens "
        "the target prefilled, ascending; null otherwise.",
    )
    conversation: ConversationUsage | None = Field(
        None, description="For a conversation kept on the server: its id and what this turn did."
    )


class UsageInfo(BaseModel):
    """OpenAI usage; ``prompt_tokens`` is the original prompt length, not the kept count."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    specprefill: SpecPrefillUsage | None = None


# ----------------------------------------------------------------------------- requests
class ContentPart(_Lenient):
    """An OpenAI content part; only ``{"type": "text", "text": ...}`` is served."""

    type: Text
    text: Text | None = None


class ToolCallFunction(_Lenient):
    """The function of a tool call: its name and its arguments as JSON text."""

    name: Text = Field(min_length=1, max_length=256)
    arguments: Text = Field(description="JSON text of an object, as the model wrote it.")


class ToolCallObject(_Lenient):
    """A tool call of an assistant message (in a request's history, and in an answer)."""

    id: Text = Field(max_length=256)
    type: Literal["function"] = "function"
    function: ToolCallFunction


#: The roles OpenAI's chat API accepts; a chat template writes the role as text into the prompt,
#: so any other string could forge a turn (a role holding template control tokens).
CHAT_ROLES = ("system", "developer", "user", "assistant", "tool", "function")


def _known_role(role: str) -> str:
    if role not in CHAT_ROLES:
        raise PydanticCustomError(
            "invalid_role",
            "role {role!r} is not a chat role; use one of {roles}",
            {"role": role[:64], "roles": ", ".join(CHAT_ROLES)},
        )
    return role


class ChatMessage(_Lenient):
    """One chat message: ``role`` is one of `CHAT_ROLES`; ``tool_calls`` (assistant) and ``tool_call_id``
    (role ``tool``) reach the chat template."""

    role: Annotated[Text, AfterValidator(_known_role)] = Field(json_schema_extra={"enum": list(CHAT_ROLES)})
    content: Text | list[ContentPart] | None = None
    name: Text | None = None
    tool_calls: list[ToolCallObject] | None = Field(None, max_length=128)
    tool_call_id: Text | None = Field(None, max_length=256)


class ToolFunction(_Strict):
    """A function the model may call: OpenAI's ``tools[].function``."""

    name: Text = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$")
    description: Text | None = None
    parameters: dict[str, Any] | None = Field(None, description="A JSON Schema object of the arguments.")
    strict: bool | None = Field(
        None,
        description="Passed to the chat template; decoding is not constrained to the schema (as vLLM without "
        "structured outputs).",
    )


class ToolDefinition(_Strict):
    """One entry of ``tools``."""

    type: Literal["function"]
    function: ToolFunction


class StreamOptions(_Lenient):
    include_usage: bool = False


class _SamplingFields(_Lenient):
    model: Text | None = Field(None, description="The served model's id (GET /v1/models); default: it.")
    # Numbers and switches are strict, as OpenAI's API is: `"max_tokens": true` is a 400, not 1.
    max_tokens: int | None = Field(
        None,
        ge=1,
        strict=True,
        description="Tokens to generate (default: what the context leaves after the prompt, within the server's "
        "--max-output-tokens).",
    )
    temperature: float | None = Field(None, ge=0.0, le=2.0, strict=True)
    top_p: float | None = Field(None, gt=0.0, le=1.0, strict=True)
    stop: StopString | Annotated[list[StopString], Field(max_length=4)] | None = Field(
        None, description="A stop string or up to 4 of them."
    )
    seed: int | None = Field(None, ge=0, le=2**63 - 1, strict=True)
    repetition_penalty: Annotated[
        float | None, _refuse(lambda r: r != 1.0, "not served: only 1.0 (no penalty) or absent")
    ] = Field(None, gt=0.0, description="vLLM's extension: only 1.0 (no penalty) is served.")
    n: Annotated[
        int | None, _refuse(lambda n: n > 1, "more than one choice is not served: send n=1 or leave it out")
    ] = Field(None, ge=1, strict=True, description="Only 1 is served.")
    stream: bool = Field(False, strict=True)
    stream_options: StreamOptions | None = None
    user: Text | None = None
    ignore_eos: bool | None = Field(
        None,
        strict=True,
        description="vLLM's extension: keep generating past the end-of-sequence token, up to max_tokens.",
    )
    response_format: Annotated[
        dict[str, Any] | None,
        _refuse(
            lambda f: f.get("type") != "text",
            "json_object and json_schema are not served: this server does not constrain its output to JSON; "
            'send {"type": "text"} or leave response_format out',
        ),
    ] = Field(None, description='Only {"type": "text"} (the default) is served.')
    logit_bias: Annotated[
        dict[str, Any] | None, _refuse(bool, "not served: this server does not bias logits; leave it out")
    ] = Field(None, description="Not served: only absent or empty.")
    presence_penalty: Annotated[float | None, _refuse(bool, "not served: only 0 or absent")] = Field(
        None, strict=True, description="Not served: only 0 or absent."
    )
    frequency_penalty: Annotated[float | None, _refuse(bool, "not served: only 0 or absent")] = Field(
        None, strict=True, description="Not served: only 0 or absent."
    )
    specprefill: SpecPrefillOptions | None = Field(
        None, description="Per-request speculative-prefill control (send with the openai client's extra_body)."
    )


class ChatCompletionRequest(_SamplingFields):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessage] | None = Field(
        None,
        min_length=1,
        max_length=4096,
        description="The conversation (required unless specprefill.prompt_token_ids is given).",
    )
    max_completion_tokens: int | None = Field(None, ge=1, strict=True, description="Alias of max_tokens.")
    logprobs: bool | None = Field(
        None, strict=True, description="Return each generated token's log-probability (choices[].logprobs.content)."
    )
    top_logprobs: int | None = Field(
        None,
        ge=0,
        le=MAX_LOGPROBS,
        strict=True,
        description=f"With logprobs: also the 0 to {MAX_LOGPROBS} most likely tokens of each step.",
    )
    tools: list[ToolDefinition] | None = Field(
        None,
        max_length=128,
        description="Functions the model may call: rendered by the model's chat template (400 when it has no tool "
        "support); calls in the Hermes/Qwen <tool_call> format come back as tool_calls.",
    )
    tool_choice: Annotated[Any, _refuse(lambda c: c not in _NO_CALL, _TOOL_CHOICE_REFUSED)] = Field(
        None, description='"auto" (default with tools: the model decides) or "none" (no calls parsed); others refused.'
    )
    parallel_tool_calls: Annotated[
        bool | None,
        _refuse(lambda p: p is False, "false is not served: this server cannot stop a model at its first call"),
    ] = Field(None, strict=True, description="Only true or absent: every call the model writes is returned.")
    functions: Annotated[
        list[Any] | None,
        _refuse(bool, "deprecated in OpenAI's API and not served: send them as tools"),
    ] = Field(None, description="Deprecated by OpenAI (replaced by tools); not served: only absent or empty.")
    function_call: Annotated[
        Any,
        _refuse(lambda c: c not in _NO_CALL, "deprecated in OpenAI's API and not served: send tools and tool_choice"),
    ] = Field(None, description='Deprecated by OpenAI; not served: only absent, "none" or "auto".')

    @field_validator("top_logprobs")
    @classmethod
    def _top_needs_logprobs(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is not None and info.data.get("logprobs") is not True:
            raise PydanticCustomError("logprobs_required", "top_logprobs needs logprobs: true")
        return value

    @property
    def top_logprob_count(self) -> int | None:
        """The alternatives per token the request asks for (None: no logprobs)."""
        return (self.top_logprobs or 0) if self.logprobs else None


PromptField = Text | list[int] | list[Text] | list[list[int]]


class CompletionRequest(_SamplingFields):
    """``POST /v1/completions``: ``prompt`` as text or as token ids."""

    prompt: PromptField | None = Field(
        None, description="Text or token ids (one prompt; required unless specprefill.prompt_token_ids)."
    )
    echo: Annotated[bool | None, _refuse(bool, "not served: leave it out or send false")] = Field(
        None, strict=True, description="Not served: only false or absent."
    )
    logprobs: int | None = Field(
        None,
        ge=0,
        le=MAX_LOGPROBS,
        strict=True,
        description=f"Return each token's log-probability and the 0 to {MAX_LOGPROBS} most likely tokens of its step.",
    )
    best_of: Annotated[
        int | None, _refuse(lambda n: n > 1, "more than one candidate is not served: send best_of=1 or leave it out")
    ] = Field(None, ge=1, strict=True, description="Only 1 is served.")
    suffix: Annotated[Text | None, _refuse(bool, "not served (insertion): leave it out")] = Field(
        None, description="Not served: only absent or empty."
    )


class TokenizeRequest(_Lenient):
    """``POST /v1/tokenize`` (and vLLM's ``POST /tokenize``): the ids the target prefills for
    ``messages`` (chat template) or ``prompt``; the fields of vLLM's two tokenize requests."""

    model: Text | None = None
    messages: list[ChatMessage] | None = Field(None, min_length=1, max_length=4096)
    prompt: Text | None = None
    add_generation_prompt: bool = True
    add_special_tokens: bool | None = Field(
        None,
        description="As vLLM: true for prompt, false for messages (the template writes them); only that value.",
    )
    return_token_strs: bool = Field(False, description="Add each token's string (token_strs).")
    tools: list[ToolDefinition] | None = Field(
        None, max_length=128, description="With messages: tool definitions, rendered by the chat template."
    )
    continue_final_message: Annotated[
        bool | None, _refuse(bool, "not served: the last message is always closed; leave it out or send false")
    ] = None
    chat_template: Annotated[
        Text | None, _refuse(lambda _: True, "not served: the model's own chat template is applied; leave it out")
    ] = None


class DetokenizeRequest(_Lenient):
    """``POST /v1/detokenize`` (and vLLM's ``POST /detokenize``): the text of token ids."""

    model: Text | None = None
    tokens: list[Annotated[int, Field(strict=True)]] = Field(max_length=MAX_WIRE_TOKENS)


# ----------------------------------------------------------------------------- responses
class TokenizeResponse(BaseModel):
    """vLLM's tokenize answer, with the served model's id."""

    tokens: list[int]
    count: int
    max_model_len: int
    token_strs: list[str] | None = Field(None, description="Each token's string (return_token_strs).")
    model: str


class DetokenizeResponse(BaseModel):
    """vLLM's detokenize answer: the decoded text."""

    prompt: str


class TopLogprob(BaseModel):
    token: str
    logprob: float = Field(description="Natural log; -9999.0 stands for -inf.")
    bytes: list[int] | None


class TokenLogprobInfo(TopLogprob):
    """One generated token: its log-probability and the most likely tokens of its step."""

    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[TokenLogprobInfo] | None


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]] = Field(description="Per token: the most likely tokens and the chosen one.")
    text_offset: list[int]


class ChatResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCallObject] | None = Field(None, description="The calls the model wrote (with tools).")


class ChatChoice(BaseModel):
    index: int = 0
    message: ChatResponseMessage
    finish_reason: Literal["stop", "length", "tool_calls"]
    logprobs: ChatLogprobs | None = None
    token_ids: list[int] | None = Field(None, description="Generated ids (specprefill.return_token_ids).")


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo
    system_fingerprint: str | None = None


class DeltaToolCall(ToolCallObject):
    """A streamed tool call: each call comes whole, in one chunk."""

    index: int


class DeltaMessage(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None


class ChunkChoice(BaseModel):
    index: int = 0
    delta: DeltaMessage
    finish_reason: Literal["stop", "length", "tool_calls"] | None = None
    logprobs: ChatLogprobs | None = None
    token_ids: list[int] | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: UsageInfo | None = None
    system_fingerprint: str | None = None


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    finish_reason: Literal["stop", "length"] | None = None
    logprobs: CompletionLogprobs | None = None
    token_ids: list[int] | None = None


class TextCompletion(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo
    system_fingerprint: str | None = None


class TextCompletionChunk(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None
    system_fingerprint: str | None = None


class ConversationCapability(BaseModel):
    """How this server keeps conversations (``specprefill.conversations`` of a model card)."""

    strategies: list[str]
    default_strategy: str
    ttl_s: float = Field(description="Seconds a conversation may stay idle before it expires.")
    max_conversations: int = Field(description="Conversations stored at once (least recently used evicted).")
    max_conversations_per_key: int = Field(description="Conversations one API key may hold at once.")


class SpecPrefillCapability(BaseModel):
    """The ``specprefill`` object of a model card: what this server accepts."""

    version: str
    position_ids: bool = Field(description="Accepts pre-compressed prompt_token_ids + position_ids.")
    draft: str | None = Field(description="The draft model that scores prompts.")
    default_policy: str
    policies: list[str]
    max_context: int
    vocab_size: int
    options: list[str] = Field(description="Fields of the specprefill request object.")
    conversations: ConversationCapability | None = Field(
        None, description="Conversations kept on the server (null: not served)."
    )


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "specprefill"
    max_model_len: int
    specprefill: SpecPrefillCapability


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class WarmUpReport(BaseModel):
    """The warm-up request the server ran before it accepted requests (``--warmup-tokens``)."""

    prompt_tokens: int
    kept_tokens: int
    seconds: float


class ScoringQueueReport(BaseModel):
    """The scoring queue that batches concurrent requests' draft scoring (``--scoring-queue``)."""

    depth: int = Field(description="Prompts waiting to be scored.")
    batches: int = Field(description="Batches scored, one draft call each.")
    prompts: int = Field(description="Prompts scored in those batches.")
    largest_batch: int
    mean_batch_size: float
    scoring_ms: float = Field(description="Time spent in the draft's scoring calls.")
    cancelled: int = Field(description="Prompts dropped while waiting because their client went away.")
    max_batch_tokens: int
    max_wait_ms: float


class HealthResponse(BaseModel):
    status: Literal["ok"] = "ok"
    model: str
    draft: str | None
    in_flight: int = Field(description="Admitted requests not finished yet (running + queued).")
    running: int
    queue_depth: int
    max_concurrency: int
    max_queue: int
    cancelled_streams: int = Field(0, description="Streams stopped before their end because the client left.")
    cancelled_requests: int = Field(
        0, description="Non-streaming requests stopped, queued or running, because the client left."
    )
    conversations: int = Field(0, description="Conversations stored on the server.")
    warmup: WarmUpReport | None = Field(None, description="The warm-up run at start (None: none ran).")
    load_warmup_seconds: float | None = Field(
        None,
        description="Seconds the backend's and the draft's own warm-ups took at load: compiling their passes and "
        "measuring what they cost, for the dense-when-slower check (None: none ran).",
    )
    scoring: ScoringQueueReport | None = Field(None, description="The scoring queue (None: scoring is not queued).")
    engine_core: Literal["in-process", "subprocess"] | None = Field(
        None, description="Where vLLM's engine core runs, beside the draft or in its own process (None: not vLLM)."
    )


class ConversationTurn(BaseModel):
    """One turn of a stored conversation: what it cost and kept."""

    turn: int
    strategy: str
    prompt_tokens: int
    kept_tokens: int
    prefilled_tokens: int
    reused_tokens: int
    evicted_tokens: int
    draft_tokens: int
    dropped_messages: int


class ConversationMessage(BaseModel):
    role: str
    content: str


class ConversationObject(BaseModel):
    """``GET /v1/conversations/{id}``: a stored conversation's history and turns."""

    id: str
    object: Literal["conversation"] = "conversation"
    created: int
    last_used: int
    expires_in: float = Field(description="Seconds until it expires unless a request uses it.")
    strategy: str
    messages: list[ConversationMessage]
    turns: list[ConversationTurn]


class ConversationDeleted(BaseModel):
    """``DELETE /v1/conversations/{id}``."""

    id: str
    object: Literal["conversation.deleted"] = "conversation.deleted"
    deleted: bool = True


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """Every error answer: ``{"error": {...}}``."""

    error: ErrorDetail
