"""The position layout of a compressed request and its wire form in ``SamplingParams.extra_args``.

A compressed request sends vLLM only the kept token ids; its layout says where each of them sits in
the original prompt of ``n`` tokens. The layout travels as flat lists of integers (the only shape
that ``vllm_xargs`` accepts over HTTP) under these keys:

``specprefill_n``
    the original prompt length ``n`` (decoding continues at position ``n``);
``specprefill_spans``
    ``[start0, end0, start1, end1, ...]``: the kept positions as sorted, disjoint half-open runs;
``specprefill_positions``
    alternatively, every kept position (``[p0, p1, ...]``); the spans form is shorter and preferred.

Example::

    layout = PositionLayout.from_positions([0, 1, 2, 40, 41, 99], n=100)
    layout.to_extra_args()
    # {'specprefill_version': 1, 'specprefill_n': 100, 'specprefill_spans': [0, 3, 40, 42, 99, 100]}
    layout.cache_salt()  # 'specprefill-1-…': keeps prefix caching from mixing layouts
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...errors import InvalidRequestError
from ...types import CompressedPrompt, SamplingParams

__all__ = [
    "KEY_N",
    "KEY_POSITIONS",
    "KEY_SPANS",
    "KEY_VERSION",
    "LAYOUT_VERSION",
    "PositionLayout",
    "encode_prompt",
    "has_layout",
    "vllm_completion_body",
]

LAYOUT_VERSION = 1
KEY_VERSION = "specprefill_version"
KEY_N = "specprefill_n"
KEY_SPANS = "specprefill_spans"
KEY_POSITIONS = "specprefill_positions"
_KEYS = (KEY_VERSION, KEY_N, KEY_SPANS, KEY_POSITIONS)


def has_layout(extra_args: Mapping[str, Any] | None) -> bool:
    """Whether ``extra_args`` carries a SpecPrefill layout (any of its keys)."""
    return bool(extra_args) and any(k in extra_args for k in _KEYS)  # type: ignore[operator]


def _int_list(value: Any, key: str) -> list[int]:
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise InvalidRequestError(f"{key} must be a flat list of integers", param=key)
    out = []
    for v in value:
        # JSON numbers may arrive as floats (1.0); bools are ints in Python and never valid here.
        if isinstance(v, bool) or not isinstance(v, int | float) or int(v) != v:
            raise InvalidRequestError(f"{key} must be a flat list of integers, got {v!r}", param=key)
        out.append(int(v))
    return out


def _spans_of(positions: np.ndarray) -> np.ndarray:
    """Sorted positions -> flat ``[start, end, ...]`` runs of consecutive values."""
    if positions.size == 0:
        return np.zeros(0, dtype=np.int64)
    breaks = np.flatnonzero(np.diff(positions) != 1) + 1
    starts = np.concatenate(([positions[0]], positions[breaks]))
    ends = np.concatenate((positions[breaks - 1] + 1, [positions[-1] + 1]))
    return np.stack([starts, ends], axis=1).reshape(-1)


@dataclass(frozen=True)
class PositionLayout:
    """Where the ``K`` kept tokens of a prompt of ``n`` tokens sit: sorted disjoint runs.

    ``spans`` holds ``(start, end)`` half-open runs, sorted, non-empty, non-adjacent (adjacent runs
    are merged). ``kept`` is their total length; ``delta = n - kept`` shifts decode positions.
    """

    n: int
    spans: tuple[tuple[int, int], ...]

    def __post_init__(self) -> None:
        if self.n < 1:
            raise InvalidRequestError(f"{KEY_N} must be >= 1, got {self.n}", param=KEY_N)
        if not self.spans:
            raise InvalidRequestError("the layout keeps no token", param=KEY_SPANS)
        prev_end = -1
        for start, end in self.spans:
            if start < 0 or end <= start:
                raise InvalidRequestError(f"span ({start}, {end}) is empty or negative", param=KEY_SPANS)
            if start <= prev_end:
                raise InvalidRequestError("spans must be sorted, disjoint and non-adjacent", param=KEY_SPANS)
            prev_end = end
        if prev_end > self.n:
            raise InvalidRequestError(f"span end {prev_end} exceeds {KEY_N}={self.n}", param=KEY_SPANS)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_positions(cls, positions: Sequence[int] | np.ndarray, n: int) -> PositionLayout:
        """The layout of strictly increasing kept ``positions`` in a prompt of ``n`` tokens."""
        if n < 1:
            raise InvalidRequestError(f"{KEY_N} must be >= 1, got {n}", param=KEY_N)
        pos = np.asarray(positions, dtype=np.int64).reshape(-1)
        if pos.size == 0:
            raise InvalidRequestError("the layout keeps no token", param=KEY_POSITIONS)
        if pos[0] < 0 or (pos.size > 1 and np.any(np.diff(pos) <= 0)):
            raise InvalidRequestError("positions must be non-negative and strictly increasing", param=KEY_POSITIONS)
        if pos[-1] >= n:
            raise InvalidRequestError(f"positions must be below {KEY_N}={n}", param=KEY_POSITIONS)
        flat = _spans_of(pos)
        return cls(n=int(n), spans=tuple((int(a), int(b)) for a, b in flat.reshape(-1, 2)))

    @classmethod
    def from_compressed(cls, prompt: CompressedPrompt) -> PositionLayout:
        """The layout of a `CompressedPrompt` (its ``position_ids`` and ``n``)."""
        return cls.from_positions(prompt.position_ids, prompt.n)

    @classmethod
    def from_extra_args(cls, extra_args: Mapping[str, Any], num_tokens: int | None = None) -> PositionLayout:
        """Decode and validate the wire form; ``num_tokens`` (the prompt's ids) must equal ``kept``.

        Raises:
            InvalidRequestError: a missing or malformed key, or a layout that does not fit the prompt.
        """
        version = extra_args.get(KEY_VERSION, LAYOUT_VERSION)
        if version != LAYOUT_VERSION:
            raise InvalidRequestError(
                f"unsupported {KEY_VERSION} {version!r}; this build reads {LAYOUT_VERSION}", param=KEY_VERSION
            )
        if KEY_N not in extra_args:
            raise InvalidRequestError(f"{KEY_N} (the original prompt length) is required", param=KEY_N)
        n_value = extra_args[KEY_N]
        if isinstance(n_value, bool) or not isinstance(n_value, int | float) or int(n_value) != n_value:
            raise InvalidRequestError(f"{KEY_N} must be an integer, got {n_value!r}", param=KEY_N)
        n = int(n_value)
        has_spans, has_positions = KEY_SPANS in extra_args, KEY_POSITIONS in extra_args
        if has_spans == has_positions:
            raise InvalidRequestError(f"give exactly one of {KEY_SPANS} or {KEY_POSITIONS}", param=KEY_SPANS)
        if has_spans:
            flat = _int_list(extra_args[KEY_SPANS], KEY_SPANS)
            if len(flat) % 2:
                raise InvalidRequestError(f"{KEY_SPANS} must hold start/end pairs", param=KEY_SPANS)
            pairs = [(flat[i], flat[i + 1]) for i in range(0, len(flat), 2)]
            # Accept adjacent runs from other encoders by merging them.
            merged: list[tuple[int, int]] = []
            for start, end in pairs:
                if merged and start == merged[-1][1] and end > start:
                    merged[-1] = (merged[-1][0], end)
                else:
                    merged.append((start, end))
            layout = cls(n=n, spans=tuple(merged))
        else:
            layout = cls.from_positions(_int_list(extra_args[KEY_POSITIONS], KEY_POSITIONS), n)
        if num_tokens is not None and num_tokens != layout.kept:
            raise InvalidRequestError(
                f"the layout places {layout.kept} tokens but the prompt has {num_tokens}", param=KEY_SPANS
            )
        return layout

    # ------------------------------------------------------------------ views
    @property
    def kept(self) -> int:
        """``K``: the number of kept tokens (the length of the prompt sent to vLLM)."""
        return sum(end - start for start, end in self.spans)

    @property
    def delta(self) -> int:
        """``n - K``: added to a generated token's compact index to get its RoPE position."""
        return self.n - self.kept

    @property
    def is_dense(self) -> bool:
        """True when every position is kept (the request needs no layout at all)."""
        return self.kept == self.n

    def positions(self) -> np.ndarray:
        """The ``K`` kept positions as int64."""
        return np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in self.spans])

    def prefill_positions(self, prefill_len: int) -> np.ndarray:
        """RoPE positions of the first ``prefill_len`` compact tokens, as int32.

        The first ``K`` are the kept positions. A request resumed after preemption re-prefills its
        generated tokens too: compact index ``i >= K`` sits at ``i + delta``.
        """
        if prefill_len < self.kept:
            raise InvalidRequestError(f"prefill of {prefill_len} tokens is shorter than the {self.kept} kept")
        out = np.empty(prefill_len, dtype=np.int32)
        out[: self.kept] = self.positions()
        out[self.kept :] = np.arange(self.kept, prefill_len, dtype=np.int64) + self.delta
        return out

    def max_position(self, max_tokens: int) -> int:
        """The largest RoPE position a request with ``max_tokens`` new tokens can reach."""
        return self.n + max_tokens - 1

    def flat_spans(self) -> list[int]:
        """``[start0, end0, start1, end1, ...]``."""
        return [v for span in self.spans for v in span]

    def to_extra_args(self) -> dict[str, Any]:
        """The wire form: flat lists of ints for ``SamplingParams.extra_args`` / ``vllm_xargs``."""
        return {KEY_VERSION: LAYOUT_VERSION, KEY_N: self.n, KEY_SPANS: self.flat_spans()}

    def cache_salt(self) -> str:
        """A prefix-cache salt unique to this layout.

        vLLM hashes token ids, not positions: without a salt, a compressed request could reuse KV
        blocks computed at other positions. Equal layouts share the salt and so their cache.
        """
        digest = hashlib.sha256(f"v{LAYOUT_VERSION}:{self.n}:".encode())
        digest.update(np.asarray(self.flat_spans(), dtype="<i8").tobytes())
        return f"specprefill-{LAYOUT_VERSION}-{digest.hexdigest()[:32]}"


def encode_prompt(prompt: CompressedPrompt) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The vLLM token prompt (``prompt_token_ids`` + ``cache_salt``) and ``extra_args`` of a prompt.

    A dense prompt (every position kept) is a plain token prompt with no extra args, exactly what
    vanilla vLLM receives; a compressed one carries its layout and a salt of it.
    """
    tokens: dict[str, Any] = {"prompt_token_ids": [int(t) for t in prompt.token_ids]}
    if prompt.is_dense:
        return tokens, None
    layout = PositionLayout.from_compressed(prompt)
    tokens["cache_salt"] = layout.cache_salt()
    return tokens, layout.to_extra_args()


def vllm_completion_body(
    prompt: CompressedPrompt, params: SamplingParams, model: str, *, stream: bool = False
) -> dict[str, Any]:
    """The JSON body of ``POST /v1/completions`` for ``vllm serve`` with the plugin.

    The kept ids go in ``prompt`` (a token-id list), the layout in ``vllm_xargs`` and its salt in
    ``cache_salt``; a dense prompt is a plain token prompt.

    Example::

        body = vllm_completion_body(compressed, SamplingParams(max_tokens=64), "meta-llama/Llama-3.1-8B")
        httpx.post("http://127.0.0.1:8000/v1/completions", json=body).json()["choices"][0]["text"]
    """
    tokens, extra = encode_prompt(prompt)
    body: dict[str, Any] = {
        "model": model,
        "prompt": tokens["prompt_token_ids"],
        **params.request_fields(),
        "return_token_ids": True,
    }
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    if extra is not None:
        body["vllm_xargs"] = extra
        body["cache_salt"] = tokens["cache_salt"]
    return body
