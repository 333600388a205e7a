"""`OpenAIBackend`: drive a remote OpenAI-compatible server over HTTP (httpx, sync and async).

Two ways to hand over a compressed prompt:

- ``positions``: the kept token ids and their original position ids go in the ``specprefill``
  extension of ``POST /completions``; the server prefills them exactly (our own server, or any that
  advertises ``{"specprefill": {"position_ids": true}}`` in ``GET /models``).
- ``text``: the kept spans are rendered back to text (non-contiguous spans joined by ``separator``)
  and sent as chat messages (``POST /chat/completions``), or as a plain prompt for text prompts, to
  any OpenAI-compatible endpoint. The remote prefills a shorter prompt; positions are its own.

``mode="auto"`` (the default) asks ``GET /models`` once and picks ``positions`` when the server
accepts them. Requests are retried with exponential backoff on 429, 5xx and connection errors;
when retries run out, `BackendUnavailableError` is raised. The W3C trace context of the caller is
injected into every request.

Example::

    backend = OpenAIBackend("http://127.0.0.1:8000/v1", model="smollm2-135m", tokenizer="smollm2-135m")
    pipe = Pipeline(DraftAttentionScorer("smollm2-135m"), Protect(Chunked(KeepRate(0.2))), backend)
    print(pipe.generate("...", max_tokens=32).text)
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import threading
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import httpx
from opentelemetry import propagate

from .._timing import elapsed_ms as _ms
from ..errors import (
    BackendUnavailableError,
    ContextTooLongError,
    InvalidRequestError,
    NotFoundError,
    PolicyError,
    SpecPrefillError,
)
from ..interfaces import BackendCapabilities
from ..rendering import DEFAULT_SEPARATOR, render_kept_messages, render_kept_text
from ..types import (
    Completion,
    CompletionChunk,
    CompressedPrompt,
    FinishReason,
    SamplingParams,
    Timings,
    Usage,
)
from .base import BackendBase

__all__ = ["DEFAULT_SEPARATOR", "OpenAIBackend", "render_kept_messages", "render_kept_text"]

logger = logging.getLogger(__name__)

Mode = Literal["auto", "positions", "text"]
Wire = Literal["specprefill", "vllm"]

_RETRY_STATUS = frozenset({429, 500, 502, 503, 504})
_FALLBACK_CONTEXT = 8192


# ----------------------------------------------------------------------------- the backend
@dataclass
class _Request:
    path: str
    body: dict[str, Any]
    chat: bool


class _Accumulator:
    """Collects a response (whole or streamed) into a `Completion`."""

    def __init__(self, backend: OpenAIBackend, prompt: CompressedPrompt, t0: float) -> None:
        self.backend = backend
        self.prompt = prompt
        self.t0 = t0
        self.text: list[str] = []
        self.token_ids: list[int] = []
        self.has_ids = False
        self.finish: str | None = None
        self.usage: Mapping[str, Any] | None = None
        self.model: str | None = None
        self.ttft = 0.0

    def add_choice(self, choice: Mapping[str, Any], chat: bool, streamed: bool) -> tuple[str, tuple[int, ...]]:
        if chat:
            part = choice.get("delta" if streamed else "message") or {}
            text = part.get("content") or ""
        else:
            text = choice.get("text") or ""
        ids = tuple(int(t) for t in (choice.get("token_ids") or ()))
        if "token_ids" in choice and choice["token_ids"] is not None:
            self.has_ids = True
        if (text or ids) and not self.text and not self.token_ids:
            self.ttft = _ms(self.t0)
        self.text.append(text)
        self.token_ids.extend(ids)
        if choice.get("finish_reason"):
            self.finish = str(choice["finish_reason"])
        return text, ids

    def add_payload(self, payload: Mapping[str, Any]) -> None:
        if payload.get("usage"):
            self.usage = payload["usage"]
        if payload.get("model"):
            self.model = str(payload["model"])

    def completion(self) -> Completion:
        text = "".join(self.text)
        if self.has_ids:
            ids = tuple(self.token_ids)
        else:
            ids = tuple(int(t) for t in self.backend.tokenizer.encode(text, add_special_tokens=False))
        usage = self.usage or {}
        completion_tokens = int(usage.get("completion_tokens") or len(ids))
        extension = usage.get("specprefill") or {}
        finish: FinishReason = "length" if self.finish == "length" else "stop"
        total = _ms(self.t0)
        return Completion(
            text=text,
            token_ids=ids,
            finish_reason=finish,
            usage=Usage(prompt_tokens=self.prompt.n, kept_tokens=self.prompt.kept, completion_tokens=completion_tokens),
            timings=Timings(prefill=float(extension.get("prefill_ms") or 0.0), ttft=self.ttft or total, total=total),
            model=self.model or self.backend.model_name,
            fallback=extension.get("fallback"),
            selection=self.prompt.selection,
        )


class OpenAIBackend(BackendBase):
    """A remote OpenAI-compatible server as the target: exact positions when it accepts them, else text.

    Args:
        base_url: the API root, as for the ``openai`` client (e.g. ``http://127.0.0.1:8000/v1``).
        model: the remote model id.
        tokenizer: the target's tokenizer, to build prompts: a model spec (loaded through
            `specprefill_sdk.models`, tokenizer files only) or a tokenizer object. Default: ``model``.
        mode: ``"positions"``, ``"text"``, or ``"auto"`` (ask ``GET /models`` once).
        api_key: sent as ``Authorization: Bearer``.
        timeout: seconds (or an ``httpx.Timeout``) for each request.
        max_retries: retries after the first attempt on 429, 5xx and connection errors.
        backoff: first retry delay in seconds, doubled each time (with jitter); ``Retry-After`` wins.
        max_backoff: the longest single delay in seconds.
        separator: text placed between non-contiguous kept spans in text mode.
        max_context: the remote's context window; default: advertised by the server, else read from
            the tokenizer's model config.
        headers: extra headers for every request.
        wire: how positions travel in ``positions`` mode: ``"specprefill"`` (the ``specprefill``
            body extension of our server) or ``"vllm"`` (``vllm_xargs`` + ``cache_salt`` for
            ``vllm serve`` with the specprefill plugin; implies ``mode="positions"``).
    """

    provider_name = "openai"

    def __init__(
        self,
        base_url: str,
        *,
        model: str,
        tokenizer: Any = None,
        mode: Mode = "auto",
        api_key: str | None = None,
        timeout: float | httpx.Timeout = 120.0,
        max_retries: int = 3,
        backoff: float = 0.5,
        max_backoff: float = 8.0,
        separator: str = DEFAULT_SEPARATOR,
        max_context: int | None = None,
        headers: Mapping[str, str] | None = None,
        wire: Wire = "specprefill",
    ) -> None:
        if wire not in ("specprefill", "vllm"):
            raise InvalidRequestError(f"wire must be 'specprefill' or 'vllm', got {wire!r}", param="wire")
        if wire == "vllm" and mode == "text":
            raise InvalidRequestError("wire='vllm' sends positions: it needs mode='positions'", param="wire")
        if wire == "vllm":
            mode = "positions"  # a vLLM server with the plugin does not advertise it: the caller says so
        if mode not in ("auto", "positions", "text"):
            raise InvalidRequestError(f"mode must be 'auto', 'positions' or 'text', got {mode!r}", param="mode")
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise InvalidRequestError(f"base_url must be an http(s) URL, got {base_url!r}", param="base_url")
        if max_retries < 0:
            raise InvalidRequestError("max_retries must be >= 0", param="max_retries")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.requested_mode: Mode = mode
        self.wire: Wire = wire
        self.max_retries = max_retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.separator = separator
        self._timeout = timeout if isinstance(timeout, httpx.Timeout) else httpx.Timeout(timeout)
        self._headers = {"Accept": "application/json", **(headers or {})}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._tokenizer, self._tokenizer_source = _resolve_tokenizer(tokenizer if tokenizer is not None else model)
        self._max_context = max_context
        self._remote: Mapping[str, Any] | None = None
        self._mode: Literal["positions", "text"] | None = None if mode == "auto" else mode
        self._lock = threading.Lock()
        self._client = httpx.Client(timeout=self._timeout, headers=self._headers)
        self._aclient: httpx.AsyncClient | None = None
        self._aclient_loop: asyncio.AbstractEventLoop | None = None

    def __repr__(self) -> str:
        return f"OpenAIBackend({self.base_url!r}, model={self.model!r}, mode={self.requested_mode!r})"

    # ------------------------------------------------------------------ facts
    @property
    def model_name(self) -> str:
        return self.model

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    @property
    def mode(self) -> Literal["positions", "text"]:
        """The mode in use (``"auto"`` is resolved by asking the server once)."""
        if self._mode is None:
            with self._lock:
                if self._mode is None:
                    self._apply_models(self._detect())
        assert self._mode is not None
        return self._mode

    @property
    def capabilities(self) -> BackendCapabilities:
        """Exact positions in ``positions`` mode; text only otherwise (resolves ``auto``)."""
        return BackendCapabilities(supports_position_ids=self.mode == "positions", supports_streaming=True)

    @capabilities.setter
    def capabilities(self, value: BackendCapabilities) -> None:
        """Declare what the server accepts instead of asking it: position ids -> ``positions`` mode."""
        self._mode = "positions" if value.supports_position_ids else "text"

    @property
    def max_context(self) -> int:
        """The remote context window: configured, advertised by the server, or from the tokenizer's model."""
        if self._max_context is None:
            if self._remote is None and self.requested_mode != "text":
                _ = self.mode
            advertised = (self._remote or {}).get("max_context") if self._remote else None
            self._max_context = (
                int(advertised) if advertised else _local_context(self._tokenizer_source, self._tokenizer)
            )
        return self._max_context

    # ------------------------------------------------------------------ detection
    def _detect(self) -> Mapping[str, Any]:
        try:
            response = self._send_with_retries("GET", "/models", None)
        except NotFoundError:
            return {}
        return _json(response)

    async def _adetect(self) -> Mapping[str, Any]:
        try:
            response = await self._asend_with_retries("GET", "/models", None)
        except NotFoundError:
            return {}
        return _json(response)

    def _apply_models(self, payload: Mapping[str, Any]) -> None:
        cards = payload.get("data") if isinstance(payload, Mapping) else None
        capability: Mapping[str, Any] | None = None
        for card in cards if isinstance(cards, list) else []:
            if isinstance(card, Mapping) and card.get("id") == self.model:
                value = card.get("specprefill")
                capability = value if isinstance(value, Mapping) else None
                break
        self._remote = capability or {}
        if capability and capability.get("vocab_size") and capability["vocab_size"] != len(self._tokenizer):
            logger.warning(
                "the remote vocabulary has %s ids, the local tokenizer %s: is it the target's tokenizer?",
                capability["vocab_size"],
                len(self._tokenizer),
            )
        if self.requested_mode == "auto":
            self._mode = "positions" if capability and capability.get("position_ids") else "text"
            logger.info("%s: using %s mode", self.base_url, self._mode)

    async def _amode(self) -> Literal["positions", "text"]:
        if self._mode is None:
            self._apply_models(await self._adetect())
        assert self._mode is not None
        return self._mode

    # ------------------------------------------------------------------ request bodies
    def _request(self, prompt: CompressedPrompt, params: SamplingParams, mode: str, stream: bool) -> _Request:
        body: dict[str, Any] = {"model": self.model, **params.request_fields()}
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        if mode == "positions" and self.wire == "vllm":
            from .vllm.layout import vllm_completion_body

            return _Request("/completions", vllm_completion_body(prompt, params, self.model, stream=stream), chat=False)
        if mode == "positions":
            body["specprefill"] = {
                "prompt_token_ids": list(prompt.token_ids),
                "position_ids": list(prompt.position_ids),
                "prompt_length": prompt.n,
                "return_token_ids": True,
            }
            return _Request("/completions", body, chat=False)
        if prompt.prompt is not None and prompt.prompt.messages is not None:
            body["messages"] = render_kept_messages(prompt, self._tokenizer, self.separator)
            return _Request("/chat/completions", body, chat=True)
        body["prompt"] = render_kept_text(prompt, self._tokenizer, self.separator)
        return _Request("/completions", body, chat=False)

    def _headers_for_call(self) -> dict[str, str]:
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        return carrier

    # ------------------------------------------------------------------ retries
    def _delay(self, attempt: int, response: httpx.Response | None) -> float:
        retry_after = response.headers.get("retry-after") if response is not None else None
        if retry_after:
            try:
                return min(max(float(retry_after), 0.0), self.max_backoff)
            except ValueError:
                pass
        base = min(self.backoff * (2**attempt), self.max_backoff)
        return base * (0.5 + random.random() / 2)

    def _send_with_retries(self, method: str, path: str, body: dict[str, Any] | None) -> httpx.Response:
        retry = _Retries(self, method, path)
        for attempt in retry:
            response: httpx.Response | None = None
            try:
                response = self._client.request(
                    method, self.base_url + path, json=body, headers=self._headers_for_call()
                )
            except httpx.TransportError as exc:
                retry.failed(exc)
            else:
                if retry.accept(response):
                    return response
            time.sleep(retry.delay(attempt, response))
        raise retry.error()

    def _open_stream(self, path: str, body: dict[str, Any]) -> httpx.Response:
        """Open a streaming response, retrying before any byte of the answer was read."""
        retry = _Retries(self, "POST", path)
        for attempt in retry:
            response: httpx.Response | None = None
            try:
                request = self._client.build_request(
                    "POST", self.base_url + path, json=body, headers=self._headers_for_call()
                )
                response = self._client.send(request, stream=True)
            except httpx.TransportError as exc:
                retry.failed(exc)
            else:
                if response.status_code >= 400:
                    response.read()
                    response.close()
                if retry.accept(response):
                    return response
            time.sleep(retry.delay(attempt, response))
        raise retry.error()

    def _async_client(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        if self._aclient is None or self._aclient_loop is not loop:
            self._aclient = httpx.AsyncClient(timeout=self._timeout, headers=self._headers)
            self._aclient_loop = loop
        return self._aclient

    async def _asend_with_retries(self, method: str, path: str, body: dict[str, Any] | None) -> httpx.Response:
        client = self._async_client()
        retry = _Retries(self, method, path)
        for attempt in retry:
            response: httpx.Response | None = None
            try:
                response = await client.request(
                    method, self.base_url + path, json=body, headers=self._headers_for_call()
                )
            except httpx.TransportError as exc:
                retry.failed(exc)
            else:
                if retry.accept(response):
                    return response
            await asyncio.sleep(retry.delay(attempt, response))
        raise retry.error()

    async def _aopen_stream(self, path: str, body: dict[str, Any]) -> httpx.Response:
        client = self._async_client()
        retry = _Retries(self, "POST", path)
        for attempt in retry:
            response: httpx.Response | None = None
            try:
                request = client.build_request(
                    "POST", self.base_url + path, json=body, headers=self._headers_for_call()
                )
                response = await client.send(request, stream=True)
            except httpx.TransportError as exc:
                retry.failed(exc)
            else:
                if response.status_code >= 400:
                    await response.aread()
                    await response.aclose()
                if retry.accept(response):
                    return response
            await asyncio.sleep(retry.delay(attempt, response))
        raise retry.error()

    # ------------------------------------------------------------------ generation
    def _check(self, prompt: CompressedPrompt, params: SamplingParams) -> None:
        if not isinstance(prompt, CompressedPrompt):
            raise InvalidRequestError(f"expected a CompressedPrompt, got {type(prompt).__name__}", param="prompt")
        if not isinstance(params, SamplingParams):
            raise InvalidRequestError(f"expected SamplingParams, got {type(params).__name__}", param="params")
        if params.logprobs is not None:
            # The remote names tokens by their text, not their ids: its logprobs are not this
            # backend's to turn into TokenLogprob entries.
            raise InvalidRequestError(
                "OpenAIBackend does not return logprobs: ask the remote server for them directly, or use an "
                "in-process backend (transformers, vllm)",
                param="logprobs",
                code="unsupported_parameter",
            )

    def generate(self, prompt: CompressedPrompt, params: SamplingParams) -> Completion:
        """Send ``prompt`` (positions or rendered text) and return the remote's answer.

        Raises:
            BackendUnavailableError: the server cannot be reached, or kept failing with 429/5xx.
            InvalidRequestError: the server rejected the request (4xx).
        """
        self._check(prompt, params)
        request = self._request(prompt, params, self.mode, stream=False)
        t0 = time.perf_counter()
        payload = _json(self._send_with_retries("POST", request.path, request.body))
        return self._collect(prompt, payload, request.chat, t0)

    async def agenerate(self, prompt: CompressedPrompt, params: SamplingParams) -> Completion:
        """Async `generate` over an ``httpx.AsyncClient``."""
        self._check(prompt, params)
        request = self._request(prompt, params, await self._amode(), stream=False)
        t0 = time.perf_counter()
        payload = _json(await self._asend_with_retries("POST", request.path, request.body))
        return self._collect(prompt, payload, request.chat, t0)

    def _collect(self, prompt: CompressedPrompt, payload: Mapping[str, Any], chat: bool, t0: float) -> Completion:
        acc = _Accumulator(self, prompt, t0)
        choices = payload.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
            raise BackendUnavailableError(f"{self.base_url} answered without choices: {str(payload)[:200]}")
        acc.add_choice(choices[0], chat, streamed=False)
        acc.add_payload(payload)
        return acc.completion()

    def stream(self, prompt: CompressedPrompt, params: SamplingParams) -> Iterator[CompletionChunk]:
        """Stream the remote's answer as `CompletionChunk` deltas; the last one carries the `Completion`.

        Closing the iterator closes the HTTP response, which stops the remote's generation.
        """
        self._check(prompt, params)
        request = self._request(prompt, params, self.mode, stream=True)
        return self._stream(prompt, request)

    def _stream(self, prompt: CompressedPrompt, request: _Request) -> Iterator[CompletionChunk]:
        t0 = time.perf_counter()
        acc = _Accumulator(self, prompt, t0)
        response = self._open_stream(request.path, request.body)
        try:
            for line in response.iter_lines():
                done, chunk = self._on_line(acc, line, request.chat)
                if done:
                    break
                if chunk is not None:
                    yield chunk
        except httpx.TransportError as exc:
            raise BackendUnavailableError(f"the stream from {self.base_url} broke: {exc}") from exc
        finally:
            response.close()
        final = acc.completion()
        yield CompletionChunk(text="", finish_reason=final.finish_reason, completion=final)

    async def astream(self, prompt: CompressedPrompt, params: SamplingParams) -> AsyncIterator[CompletionChunk]:
        """Async `stream` over an ``httpx.AsyncClient``."""
        self._check(prompt, params)
        request = self._request(prompt, params, await self._amode(), stream=True)
        t0 = time.perf_counter()
        acc = _Accumulator(self, prompt, t0)
        response = await self._aopen_stream(request.path, request.body)
        try:
            async for line in response.aiter_lines():
                done, chunk = self._on_line(acc, line, request.chat)
                if done:
                    break
                if chunk is not None:
                    yield chunk
        except httpx.TransportError as exc:
            raise BackendUnavailableError(f"the stream from {self.base_url} broke: {exc}") from exc
        finally:
            await response.aclose()
        final = acc.completion()
        yield CompletionChunk(text="", finish_reason=final.finish_reason, completion=final)

    def _on_line(self, acc: _Accumulator, line: str, chat: bool) -> tuple[bool, CompletionChunk | None]:
        """One SSE line: (end of stream, a text chunk or None)."""
        if not line.startswith("data:"):
            return False, None
        data = line[5:].strip()
        if data == "[DONE]":
            return True, None
        try:
            payload = json.loads(data)
        except json.JSONDecodeError as exc:
            raise BackendUnavailableError(f"{self.base_url} sent an event that is not JSON: {data[:200]}") from exc
        if not isinstance(payload, Mapping):
            return False, None
        if "error" in payload:
            raise _error_from_body(payload, 500)
        acc.add_payload(payload)
        choices = payload.get("choices") or []
        if not choices or not isinstance(choices[0], Mapping):
            return False, None
        text, ids = acc.add_choice(choices[0], chat, streamed=True)
        if not text and not ids:
            return False, None
        return False, CompletionChunk(text=text, token_ids=ids)

    # ------------------------------------------------------------------ lifetime
    def close(self) -> None:
        """Close the HTTP connections (the async client too, when its loop is gone)."""
        self._client.close()

    async def aclose(self) -> None:
        """Close the async HTTP connections."""
        if self._aclient is not None:
            await self._aclient.aclose()
            self._aclient = None

    def __enter__(self) -> OpenAIBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ----------------------------------------------------------------------------- helpers
def _json(response: httpx.Response) -> Mapping[str, Any]:
    try:
        payload = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BackendUnavailableError(f"{response.request.url} answered with a body that is not JSON") from exc
    if not isinstance(payload, Mapping):
        raise BackendUnavailableError(f"{response.request.url} answered with JSON that is not an object")
    return payload


def _message(response: httpx.Response) -> str:
    try:
        body = response.json()
    except Exception:
        return response.text[:200]
    error = body.get("error") if isinstance(body, Mapping) else None
    if isinstance(error, Mapping):
        return str(error.get("message"))
    return str(body)[:200]


def _remote_error(response: httpx.Response) -> SpecPrefillError:
    try:
        body = response.json()
    except Exception:
        body = {"error": {"message": response.text[:500] or response.reason_phrase}}
    return _error_from_body(body if isinstance(body, Mapping) else {}, response.status_code)


def _error_from_body(body: Mapping[str, Any], status: int) -> SpecPrefillError:
    """The SDK error for a remote OpenAI-style error body."""
    error = body.get("error")
    detail: Mapping[str, Any] = error if isinstance(error, Mapping) else {"message": str(error or body)}
    message = f"remote: {detail.get('message') or 'request failed'}"
    param = detail.get("param") if isinstance(detail.get("param"), str) else None
    code = detail.get("code") if isinstance(detail.get("code"), str) else None
    if status in (401, 403):
        return BackendUnavailableError(message, code=code or "authentication_failed")
    if status == 404:
        return NotFoundError(message, param=param, code=code)
    if status < 500:
        if code == "context_length_exceeded":
            return ContextTooLongError(message, param=param)
        if code == "invalid_policy":
            return PolicyError(message, param=param)
        return InvalidRequestError(message, param=param, code=code)
    return BackendUnavailableError(message, code=code)


def _resolve_tokenizer(spec: Any) -> tuple[Any, Any]:
    """A tokenizer object and where it came from (a model folder path, or None)."""
    if not isinstance(spec, str):
        if not callable(getattr(spec, "encode", None)) or not callable(getattr(spec, "decode", None)):
            raise InvalidRequestError("tokenizer must be a model spec or a tokenizer object", param="tokenizer")
        return spec, getattr(spec, "name_or_path", None)
    from transformers import AutoTokenizer

    from ..errors import ModelLoadError
    from ..models import resolve_model_path

    source = resolve_model_path(spec, progress=False)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(source), local_files_only=True)
    except Exception as exc:
        raise ModelLoadError(f"could not load the tokenizer of {spec!r} from {source}: {exc}") from exc
    if not getattr(tokenizer, "is_fast", False):
        raise ModelLoadError(f"the tokenizer of {spec!r} is not a fast tokenizer; character offsets need one")
    return tokenizer, source


def _local_context(source: Any, tokenizer: Any) -> int:
    """The context window from the tokenizer's model config, else its ``model_max_length``."""
    if source:
        try:
            from transformers import AutoConfig

            config = AutoConfig.from_pretrained(str(source), local_files_only=True)
            text = config.get_text_config() if hasattr(config, "get_text_config") else config
            value = getattr(text, "max_position_embeddings", None)
            if value:
                return int(value)
        except Exception:
            logger.debug("no model config next to the tokenizer at %s", source)
    length = getattr(tokenizer, "model_max_length", None)
    if isinstance(length, int) and 0 < length < 10_000_000:
        return length
    return _FALLBACK_CONTEXT


class _Retries:
    """The attempts of one request (the first and ``max_retries`` more), shared by the sync and async paths.

    Iterating yields the attempt numbers; `accept` returns True for a response to keep, raises the
    remote error for a status that is not retried and records the others; `delay` is the pause before
    the next attempt (0 after the last one); `error` is what to raise when every attempt failed.
    """

    def __init__(self, backend: OpenAIBackend, method: str, path: str) -> None:
        self.backend, self.method, self.path = backend, method, path
        self.last = ""

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.backend.max_retries + 1))

    def failed(self, exc: Exception) -> None:
        self.last = f"{type(exc).__name__}: {exc}"

    def accept(self, response: httpx.Response) -> bool:
        if response.status_code < 400:
            return True
        if response.status_code not in _RETRY_STATUS:
            raise _remote_error(response)
        self.last = f"HTTP {response.status_code}: {_message(response)}"
        return False

    def delay(self, attempt: int, response: httpx.Response | None) -> float:
        if attempt >= self.backend.max_retries:
            return 0.0
        delay = self.backend._delay(attempt, response)
        logger.info("%s %s failed (%s); retrying in %.2fs", self.method, self.path, self.last, delay)
        return delay

    def error(self) -> BackendUnavailableError:
        backend = self.backend
        return BackendUnavailableError(
            f"{backend.base_url}{self.path} failed after {backend.max_retries + 1} attempts: {self.last}"
        )
