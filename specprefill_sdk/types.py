"""The data that flows between the stages: Prompt -> TokenScores -> Selection -> CompressedPrompt -> Completion.

All of these are plain, immutable dataclasses. Token indices are positions in the *target's*
tokenization of the prompt, 0-based; ``n`` is always the original prompt length.
"""

from __future__ import annotations

import array
import json
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, overload

import numpy as np
import torch

from .errors import InvalidRequestError
from .validation import check_float, check_int, check_rate

__all__ = [
    "CONTENT_WINDOW",
    "Aggregation",
    "Completion",
    "CompletionChunk",
    "CompressedPrompt",
    "Compression",
    "FinishReason",
    "Message",
    "Prompt",
    "QueryReduction",
    "SamplingParams",
    "Selection",
    "Timings",
    "TokenLogprob",
    "TokenScores",
    "ToolCall",
    "Usage",
]


def int64_tensor(values: Sequence[int]) -> torch.Tensor:
    """``torch.tensor(values, dtype=torch.long)`` for a sequence of ints, several times faster when long.

    Token ids and positions cross from Python to torch on every request; for a few thousand of them
    `torch.tensor` reads each element on its own, while this goes through one C array.
    """
    if not values:
        return torch.zeros(0, dtype=torch.long)
    return torch.frombuffer(array.array("q", values), dtype=torch.long)


def _increasing(values: Sequence[int]) -> bool:
    """Whether ``values`` is strictly increasing (compared in C: no Python frame per element)."""
    return not any(map(operator.ge, values, values[1:]))


FinishReason = Literal["stop", "length"]
#: How draft-attention scoring reduces its attention rows over layers and heads (`DraftAttentionScorer`):
#: ``"max"`` the largest pooled attention any head of any layer pays a token; ``"mean"`` their mean;
#: ``"content-mean"`` their mean after each row drops the attention sink (the first token) and the
#: local window (the prompt's last `CONTENT_WINDOW` tokens) and is renormalised over what is left;
#: ``"last-layer"`` the mean over the heads of the deepest scored layer only (one layer votes, as in
#: GemFilter, instead of every layer up to it).
Aggregation = Literal["max", "mean", "content-mean", "last-layer"]
#: How draft-attention scoring combines its queries' per-token scores (`DraftAttentionScorer`):
#: ``"mean"`` (the paper's) their mean; ``"max"`` the largest, so that a token one query needs
#: strongly is not averaged away by the others.
QueryReduction = Literal["mean", "max"]
#: The local window, in prompt tokens, that ``"content-mean"`` leaves out of every attention row (at
#: most half of a prompt's tokens after the first)
CONTENT_WINDOW = 256

#: The most alternatives per step `SamplingParams.logprobs` may ask for (OpenAI's ``top_logprobs`` bound).
MAX_LOGPROBS = 20

#: Role given to tokens that belong to no message (chat-template glue, generation prompt).
TEMPLATE_ROLE = "template"
#: Role given to every token of a plain-text prompt.
TEXT_ROLE = "text"


@dataclass(frozen=True)
class ToolCall:
    """A function call of an assistant message: ``arguments`` is JSON text of an object, as OpenAI sends it."""

    id: str
    name: str
    arguments: str = "{}"

    @classmethod
    def coerce(cls, value: ToolCall | Mapping[str, Any]) -> ToolCall:
        """Accept a `ToolCall` or OpenAI's ``{"id", "type": "function", "function": {"name", "arguments"}}``."""
        if isinstance(value, ToolCall):
            return value
        function = value.get("function") if isinstance(value, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str) or not function["name"]:
            raise InvalidRequestError(
                "a tool call must be {'id', 'type': 'function', 'function': {'name', 'arguments'}}", param="messages"
            )
        arguments = function.get("arguments", "{}")
        if not isinstance(arguments, str):  # a client that sends the object itself, as chat templates take it
            arguments = json.dumps(arguments)
        call = cls(id=str(value.get("id") or ""), name=function["name"], arguments=arguments)
        call.arguments_object()  # refused here, before a chat template meets it
        return call

    def arguments_object(self) -> Any:
        """The arguments parsed from JSON (chat templates render an object, not its text).

        Raises:
            InvalidRequestError: the arguments are not JSON.
        """
        try:
            return json.loads(self.arguments)
        except json.JSONDecodeError as exc:
            raise InvalidRequestError(
                f"the arguments of tool call {self.name!r} are not JSON: {exc}", param="messages"
            ) from None

    def to_dict(self) -> dict[str, Any]:
        """OpenAI's wire form (``arguments`` as JSON text)."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True)
class Message:
    """One chat message. ``role`` is free text (``system``, ``user``, ``assistant``, ``tool``, ...).

    ``tool_calls``: the calls of an assistant message; ``tool_call_id``: the call a ``tool``
    message answers. Both reach the chat template (which decides how they read).
    """

    role: str
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None

    @classmethod
    def coerce(cls, value: Message | Mapping[str, Any]) -> Message:
        """Accept a `Message` or an OpenAI-style ``{"role": ..., "content": ...}`` mapping."""
        if isinstance(value, Message):
            return value
        if not isinstance(value, Mapping):
            raise InvalidRequestError(f"a message must be a mapping with 'role' and 'content', got {value!r}")
        role, content = value.get("role"), value.get("content")
        if not isinstance(role, str) or not role:
            raise InvalidRequestError("every message needs a non-empty string 'role'", param="messages")
        if isinstance(content, list):  # OpenAI content parts: keep the text parts, refuse the rest
            texts = []
            for part in content:
                if not isinstance(part, Mapping) or part.get("type") != "text":
                    raise InvalidRequestError("only text content parts are supported", param="messages")
                texts.append(str(part.get("text", "")))
            content = "".join(texts)
        calls = tuple(ToolCall.coerce(c) for c in value.get("tool_calls") or ())
        if content is None and calls:  # OpenAI's assistant message that only calls tools
            content = ""
        if not isinstance(content, str):
            raise InvalidRequestError("every message needs a string 'content'", param="messages")
        call_id = value.get("tool_call_id")
        if call_id is not None and not isinstance(call_id, str):
            raise InvalidRequestError("tool_call_id must be a string", param="messages")
        return cls(role=role, content=content, tool_calls=calls, tool_call_id=call_id)

    def to_dict(self) -> dict[str, Any]:
        """The mapping a chat template reads: tool-call arguments as objects, as Hugging Face templates expect."""
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments_object()}}
                for c in self.tool_calls
            ]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out


Offsets = tuple[tuple[int, int], ...]


class DeferredOffsets:
    """Token offsets known by their count only, computed when `Prompt.offsets` is first read.

    A long text's offsets are the costliest Python part of tokenizing it: one tuple per token, made
    from the tokenizer's encodings and shifted by where each piece of the text starts. Many requests
    never read them (a policy without text-aware selection, a draft that shares the target's
    vocabulary), so `build_prompt` hands a text's offsets over in this form and a prompt computes them
    on first read, once. ``compute`` must return exactly ``n`` offsets; pickling or copying the
    prompt computes them.
    """

    __slots__ = ("_compute", "_n")

    def __init__(self, n: int, compute: Callable[[], Sequence[tuple[int, int]]]) -> None:
        self._n = n
        self._compute = compute

    def __len__(self) -> int:
        return self._n

    def resolve(self) -> Offsets:
        """The offsets, as the tuple `Prompt.offsets` holds."""
        offsets = tuple(self._compute())
        if len(offsets) != self._n:
            raise RuntimeError(f"deferred offsets computed {len(offsets)} spans for {self._n} tokens")
        return offsets

    def __reduce__(self) -> tuple[type[tuple[Any, ...]], tuple[Offsets]]:
        # A copy or a pickle holds the tuple itself, not the tokenizer's encodings.
        return tuple, (self.resolve(),)


class _OffsetsField:
    """`Prompt.offsets`: given as a tuple or as `DeferredOffsets`, read as the tuple, computed on first read."""

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> _OffsetsField: ...
    @overload
    def __get__(self, obj: object, owner: type | None = None) -> Offsets: ...
    def __get__(self, obj: object | None, owner: type | None = None) -> Offsets | _OffsetsField:
        if obj is None:
            # Read on the class, as `dataclass` does to look for a default: there is none.
            raise AttributeError(self._name)
        value = obj.__dict__[self._name]
        if isinstance(value, DeferredOffsets):
            value = value.resolve()
            obj.__dict__[self._name] = value
        return value

    def __set__(self, obj: object, value: Sequence[tuple[int, int]] | DeferredOffsets) -> None:
        obj.__dict__[self._name] = value if isinstance(value, DeferredOffsets | tuple) else tuple(value)


@dataclass(frozen=True)
class Prompt:
    """A tokenized prompt with per-token provenance.

    ``token_ids`` are ids of the target model's tokenizer. For each token: ``message_index`` (the
    message it came from, -1 for template glue), ``roles`` (that message's role, ``"template"`` for
    glue, ``"text"`` for a plain-text prompt), ``offsets`` (character span in ``text``), ``special``
    (a special/added token of the tokenizer) and ``protected`` (the caller asked to keep it).
    ``generation_start`` is the index where the generation prompt (e.g. ``<|im_start|>assistant\\n``)
    begins; equal to ``n`` when there is none.

    ``offsets`` reads as a tuple of ``(start, end)`` pairs; it may be given as `DeferredOffsets`, and
    is then computed on first read.
    """

    token_ids: tuple[int, ...]
    text: str
    roles: tuple[str, ...]
    message_index: tuple[int, ...]
    if TYPE_CHECKING:
        # What readers get. `build_prompt` also passes `DeferredOffsets`, which the field's
        # descriptor takes at run time.
        offsets: Offsets
    else:
        offsets: _OffsetsField = _OffsetsField()
    special: tuple[bool, ...]
    protected: tuple[bool, ...]
    generation_start: int
    messages: tuple[Message, ...] | None = None

    def __post_init__(self) -> None:
        n = len(self.token_ids)
        for name in ("roles", "message_index", "offsets", "special", "protected"):
            # The stored value: its length, without computing deferred offsets.
            if len(self.__dict__[name]) != n:
                raise ValueError(f"Prompt.{name} has {len(self.__dict__[name])} entries for {n} tokens")
        if not 0 <= self.generation_start <= n:
            raise ValueError(f"generation_start {self.generation_start} outside [0, {n}]")

    @property
    def n(self) -> int:
        """The number of prompt tokens."""
        return len(self.token_ids)

    def __len__(self) -> int:
        return len(self.token_ids)

    @classmethod
    def from_token_ids(cls, token_ids: Sequence[int], *, text: str = "") -> Prompt:
        """A prompt made of bare token ids (no text offsets, no roles)."""
        ids = tuple(map(int, token_ids))
        n = len(ids)
        return cls(
            token_ids=ids,
            text=text,
            roles=(TEXT_ROLE,) * n,
            message_index=(0,) * n,
            offsets=((0, 0),) * n,
            special=(False,) * n,
            protected=(False,) * n,
            generation_start=n,
        )

    def with_protected(self, mask: Sequence[bool]) -> Prompt:
        """A copy whose protected mask is ``mask`` OR the current one."""
        if len(mask) != self.n:
            raise InvalidRequestError(f"protected mask has {len(mask)} entries for {self.n} tokens")
        merged = tuple(bool(a) or bool(b) for a, b in zip(self.protected, mask, strict=True))
        return replace(self, protected=merged)

    def take(self, indices: Sequence[int], *, as_text: bool = False) -> Prompt:
        """The tokens ``indices`` (increasing) of this prompt as a prompt of their own.

        Offsets still point into ``text``; the generation prompt starts after the kept tokens before
        it. ``as_text=True`` makes it a plain-text prompt (roles ``text``, one message, no generation
        prompt), so chat protections (last user turn, roles) do not apply to it.

        Example::

            prompt.take(range(start, prompt.n))   # the tokens from ``start`` on
        """
        idx = list(indices)
        m = len(idx)

        def pick(values: Sequence[Any]) -> tuple[Any, ...]:
            return tuple(values[t] for t in idx)

        if as_text:
            roles, message_index, start, messages = (TEXT_ROLE,) * m, (0,) * m, m, None
        else:
            roles, message_index, messages = pick(self.roles), pick(self.message_index), self.messages
            start = sum(1 for t in idx if t < self.generation_start)
        return Prompt(
            token_ids=pick(self.token_ids),
            text=self.text,
            roles=roles,
            message_index=message_index,
            offsets=pick(self.offsets),
            special=pick(self.special),
            protected=pick(self.protected),
            generation_start=start,
            messages=messages,
        )

    def ids_tensor(self) -> torch.Tensor:
        """The token ids as a 1-D int64 tensor."""
        return int64_tensor(self.token_ids)


@dataclass(frozen=True)
class TokenScores:
    """One importance score per prompt token (float32, length ``n``); larger means more important."""

    values: torch.Tensor
    scorer: str = ""
    info: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.values.dim() != 1:
            raise ValueError(f"TokenScores.values must be 1-D, got shape {tuple(self.values.shape)}")
        if self.values.dtype != torch.float32:
            object.__setattr__(self, "values", self.values.float())
        if self.values.device.type != "cpu":
            object.__setattr__(self, "values", self.values.cpu())

    def __len__(self) -> int:
        return int(self.values.shape[0])


@dataclass(frozen=True)
class Selection:
    """The kept token indices (sorted, unique) of a prompt of length ``n``.

    ``protected[i]`` tells whether ``indices[i]`` was kept by protection rather than by its score.
    ``dense`` marks a decision to prefill everything (keep-all or a short prompt).
    """

    indices: tuple[int, ...]
    n: int
    protected: tuple[bool, ...]
    dense: bool = False
    requested_rate: float | None = None
    chunk_size: int | None = None
    reason: str = ""

    def __post_init__(self) -> None:
        if len(self.protected) != len(self.indices):
            raise ValueError("Selection.protected must have one entry per kept index")
        if not _increasing(self.indices):
            raise ValueError("Selection.indices must be strictly increasing")
        if self.indices and not (self.indices[0] >= 0 and self.indices[-1] < self.n):
            raise ValueError(f"Selection.indices must lie in [0, {self.n})")

    @classmethod
    def keep_all(cls, n: int, *, reason: str = "keep-all") -> Selection:
        """The dense selection: every token kept."""
        return cls(indices=tuple(range(n)), n=n, protected=(False,) * n, dense=True, requested_rate=1.0, reason=reason)

    @property
    def kept(self) -> int:
        """The number of kept tokens."""
        return len(self.indices)

    @property
    def keep_ratio(self) -> float:
        """kept / n (1.0 for an empty prompt)."""
        return self.kept / self.n if self.n else 1.0

    @property
    def protected_count(self) -> int:
        return sum(self.protected)

    def mask(self) -> torch.Tensor:
        """A boolean mask of length ``n``, True where kept."""
        # Built in numpy: a torch op over a long prompt would wake torch's intra-op thread pool.
        m = np.zeros(self.n, dtype=bool)
        m[np.fromiter(self.indices, dtype=np.int64, count=len(self.indices))] = True
        return torch.from_numpy(m)


@dataclass(frozen=True)
class CompressedPrompt:
    """What the target prefills: kept ids at their original positions, and the original length ``n``.

    Decoding continues at position ``n`` (not ``len(token_ids)``).
    """

    token_ids: tuple[int, ...]
    position_ids: tuple[int, ...]
    n: int
    prompt: Prompt | None = None
    selection: Selection | None = None

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.position_ids):
            raise InvalidRequestError(
                f"token_ids ({len(self.token_ids)}) and position_ids ({len(self.position_ids)}) differ in length",
                param="position_ids",
            )
        if not self.token_ids:
            raise InvalidRequestError("the compressed prompt is empty", param="prompt_token_ids")
        pos = self.position_ids
        if pos[0] < 0 or not _increasing(pos):
            raise InvalidRequestError("position_ids must be non-negative and strictly increasing", param="position_ids")
        if pos[-1] >= self.n:
            raise InvalidRequestError(f"position_ids must be below n={self.n}", param="position_ids")

    @classmethod
    def from_selection(cls, prompt: Prompt, selection: Selection) -> CompressedPrompt:
        if selection.n != prompt.n:
            raise ValueError(f"selection is for {selection.n} tokens, prompt has {prompt.n}")
        picked = selection.indices
        if len(picked) > 1:  # itemgetter of several indices builds the tuple in C
            ids: tuple[int, ...] = operator.itemgetter(*picked)(prompt.token_ids)
        else:
            ids = tuple(prompt.token_ids[i] for i in picked)
        return cls(token_ids=ids, position_ids=selection.indices, n=prompt.n, prompt=prompt, selection=selection)

    @classmethod
    def dense(cls, prompt: Prompt) -> CompressedPrompt:
        return cls.from_selection(prompt, Selection.keep_all(prompt.n))

    @property
    def kept(self) -> int:
        return len(self.token_ids)

    @property
    def keep_ratio(self) -> float:
        return self.kept / self.n if self.n else 1.0

    @property
    def is_dense(self) -> bool:
        return self.kept == self.n


@dataclass(frozen=True)
class Compression:
    """A compressed prompt with how it was obtained: stage times and a fallback reason, if any."""

    compressed: CompressedPrompt
    score_ms: float
    select_ms: float
    fallback: str | None = None

    @property
    def selection(self) -> Selection:
        assert self.compressed.selection is not None
        return self.compressed.selection


@dataclass(frozen=True)
class SamplingParams:
    """Decoding parameters. ``temperature == 0`` means greedy; ``seed`` makes sampling reproducible.

    ``ignore_eos``: keep generating past the end-of-sequence token until ``max_tokens`` (or a stop
    string), as vLLM's option of that name does; load generators use it for fixed-length answers.

    ``logprobs``: None returns no log-probabilities; ``k`` (0 to `MAX_LOGPROBS`) returns each
    generated token's log-probability and the ``k`` most likely tokens of its step (`TokenLogprob`).
    """

    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    ignore_eos: bool = False
    logprobs: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        else:
            object.__setattr__(self, "stop", tuple(self.stop))
        check_int(self.max_tokens, "max_tokens", param="max_tokens", minimum=1)
        check_float(self.temperature, "temperature", param="temperature")
        check_rate(self.top_p, "top_p", param="top_p")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise InvalidRequestError("stop must be non-empty strings", param="stop")
        if not isinstance(self.ignore_eos, bool):
            raise InvalidRequestError(f"ignore_eos must be true or false, got {self.ignore_eos!r}", param="ignore_eos")
        if self.logprobs is not None:
            check_int(self.logprobs, "logprobs", param="logprobs", minimum=0)
            if self.logprobs > MAX_LOGPROBS:
                raise InvalidRequestError(
                    f"logprobs asks for {self.logprobs} alternatives per token; at most {MAX_LOGPROBS}",
                    param="logprobs",
                )

    @classmethod
    def from_call(cls, params: SamplingParams | None, kwargs: Mapping[str, Any]) -> SamplingParams:
        """``params``, or the parameters the keyword arguments of a call name (not both).

        Raises:
            InvalidRequestError: both given, an unknown keyword or a bad value.
        """
        if params is not None and kwargs:
            raise InvalidRequestError("pass either a SamplingParams or keyword arguments, not both")
        if params is not None:
            return params
        try:
            return cls(**kwargs)
        except TypeError as exc:
            raise InvalidRequestError(str(exc)) from exc

    def request_fields(self) -> dict[str, Any]:
        """These parameters as the fields of an OpenAI completions request body."""
        body: dict[str, Any] = {"max_tokens": self.max_tokens, "temperature": self.temperature, "top_p": self.top_p}
        if self.stop:
            body["stop"] = list(self.stop)
        if self.seed is not None:
            body["seed"] = self.seed
        if self.ignore_eos:  # vLLM's extension: sent only when asked for, since OpenAI's API refuses it
            body["ignore_eos"] = True
        if self.logprobs is not None:
            body["logprobs"] = self.logprobs
        return body

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass(frozen=True)
class Usage:
    """Token counts. ``prompt_tokens`` is the original prompt length n; ``kept_tokens`` what was prefilled."""

    prompt_tokens: int
    kept_tokens: int
    completion_tokens: int

    @property
    def keep_ratio(self) -> float:
        return self.kept_tokens / self.prompt_tokens if self.prompt_tokens else 1.0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class Timings:
    """Wall-clock times in milliseconds. ``ttft`` runs from the call to the first generated token."""

    score: float = 0.0
    select: float = 0.0
    prefill: float = 0.0
    ttft: float = 0.0
    total: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return {
            "score": self.score,
            "select": self.select,
            "prefill": self.prefill,
            "ttft": self.ttft,
            "total": self.total,
        }


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token's log-probability, and the most likely tokens of its step.

    ``top`` holds ``(token id, log-probability)`` pairs, most likely first (`SamplingParams.logprobs`
    of them). Log-probabilities are those of the model's distribution before temperature and top-p
    (vLLM's default ``raw_logprobs``), so they do not depend on how the token was sampled.
    """

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class Completion:
    """A finished generation. ``logprobs``: one entry per generated token, when they were asked for."""

    text: str
    token_ids: tuple[int, ...]
    finish_reason: FinishReason
    usage: Usage
    timings: Timings = field(default_factory=Timings)
    model: str = ""
    draft: str | None = None
    fallback: str | None = None
    selection: Selection | None = None
    logprobs: tuple[TokenLogprob, ...] | None = None

    @property
    def keep_ratio(self) -> float:
        return self.usage.keep_ratio

    def __repr__(self) -> str:
        # The generated dataclass repr prints every token id and the whole selection: pages of
        # numbers in a REPL or a log line. This one fits on a line.
        text = self.text if len(self.text) <= _REPR_TEXT else self.text[: _REPR_TEXT - 1] + "…"
        u, t = self.usage, self.timings
        parts = [
            f"text={text!r}",
            f"finish_reason={self.finish_reason!r}",
            f"tokens={u.prompt_tokens} prompt / {u.kept_tokens} kept / {u.completion_tokens} generated",
            f"ttft={t.ttft:.1f} ms",
            f"total={t.total:.1f} ms",
        ]
        if self.model:
            parts.append(f"model={self.model!r}")
        if self.fallback:
            parts.append(f"fallback={self.fallback!r}")
        return f"Completion({', '.join(parts)})"


#: Characters of the text that `Completion`'s repr shows.
_REPR_TEXT = 60


@dataclass(frozen=True)
class CompletionChunk:
    """A streamed piece: a text delta and its token ids (with their `TokenLogprob` when asked for). The
    last chunk has ``finish_reason`` set and carries the whole `Completion` (usage, timings) in ``completion``."""

    text: str
    token_ids: tuple[int, ...] = ()
    finish_reason: FinishReason | None = None
    completion: Completion | None = None
    #: last, so that the positional form ``CompletionChunk(text, ids, finish_reason, completion)`` holds
    logprobs: tuple[TokenLogprob, ...] = ()
