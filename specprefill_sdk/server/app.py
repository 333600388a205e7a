"""The OpenAI-compatible HTTP server: `create_app` builds the FastAPI application.

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions``, ``POST /v1/tokenize``,
``POST /v1/detokenize`` (both also at vLLM's root paths ``/tokenize``, ``/detokenize``),
``GET /v1/models`` (with the ``specprefill`` capability), ``GET /v1/models/{id}``,
``GET``/``DELETE /v1/conversations/{id}`` (conversations kept on the server), ``GET /health``,
``GET /metrics`` (Prometheus, with ``ServerConfig.metrics``; `specprefill_sdk.server.metrics`).

Example::

    import uvicorn
    from specprefill_sdk.server import ServerConfig, create_app

    uvicorn.run(create_app(ServerConfig(model="smollm2-135m", policy="paper")), host="127.0.0.1", port=8000)
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import logging
import time
import uuid
import warnings
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, Literal, TypeVar

import anyio
from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from fastapi.security import HTTPBearer
from starlette.types import Receive, Scope, Send

from .. import __version__
from .._cancel import GenerationStopped
from .._timing import elapsed_ms
from ..conversation import STRATEGIES
from ..errors import InvalidRequestError, NotFoundError, RequestCancelledError, SpecPrefillError
from ..interfaces import Backend, Calibrated, Executed, LocalBackend, Scorer
from ..prompt import PromptInput
from ..runtime.settings import ExecutionSettings
from ..types import Completion, Prompt, TokenLogprob, ToolCall
from . import DEFAULT_WARMUP_TOKENS
from .config import DEFAULT_MAX_BODY_BYTES, ServerConfig, is_loopback_host
from .engine import RequestContext, ServingEngine, StreamHandle, Turn, check_chat_template
from .errors import ShuttingDownError, error_body, install_error_handlers
from .limits import AUTHENTICATED_KEY, Drain, GuardMiddleware, HostCheck, Ticket
from .logprobs import TokenText, chat_logprobs, completion_logprobs
from .request_id import RequestIdMiddleware, request_arrived, request_id
from .schemas import (
    ChatCompletion,
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    ConversationCapability,
    ConversationDeleted,
    ConversationMessage,
    ConversationObject,
    ConversationTurn,
    ConversationUsage,
    DetokenizeRequest,
    DetokenizeResponse,
    ErrorResponse,
    HealthResponse,
    ModelCard,
    ModelList,
    ScoringQueueReport,
    SpecPrefillCapability,
    SpecPrefillOptions,
    SpecPrefillUsage,
    TextCompletion,
    TokenizeRequest,
    TokenizeResponse,
    UsageInfo,
    WarmUpReport,
)
from .sessions import key_owner, new_conversation_id
from .tool_calls import ToolCallParser, parse_tool_calls

__all__ = ["DEFAULT_MAX_BODY_BYTES", "create_app", "default_warmup_tokens"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse, "description": text}
    for status, text in (
        (400, "Invalid request (malformed JSON, a body off the schema, unknown policy, ids or positions out of range)"),
        (401, "Missing or wrong API key, or more than one Authorization header"),
        (403, "Without API keys: a Host header that is not loopback"),
        (404, "Unknown model or conversation"),
        (409, "The conversation is answering another request, or already exists"),
        (413, "Body or prompt too large"),
        (429, "The queue is full, or every stored conversation is in use; see Retry-After"),
        (503, "The server is shutting down, or serves as many connections as it may; see Retry-After"),
    )
}
_STREAM_DOC: dict[int | str, dict[str, Any]] = {
    200: {
        "content": {"text/event-stream": {"schema": {"type": "string"}}},
        "description": "JSON, or with stream=true server-sent events in OpenAI's chunk format",
    },
}


def create_app(
    config: ServerConfig | None = None,
    *,
    backend: Backend | None = None,
    scorer: Scorer | None = None,
    tracer_provider: Any = None,
    meter_provider: Any = None,
    **settings: Any,
) -> FastAPI:
    """Build the server application around one loaded target and one draft scorer.

    Args:
        config: the server's settings (`ServerConfig`); None: the defaults.
        backend: an already built backend (e.g. a `TransformersBackend`) instead of loading
            ``config.model``.
        scorer: an already built draft scorer instead of the default policy's.
        tracer_provider, meter_provider: OpenTelemetry providers for the pipelines and the routes.
        settings: `ServerConfig` fields given one by one, the form of earlier versions (deprecated:
            give a `ServerConfig`); not together with ``config``.

    Before the app is returned it serves the warm-up request that ``config.warmup_tokens`` asks for
    (None: `default_warmup_tokens`, that is `DEFAULT_WARMUP_TOKENS` when something compiles on a
    CUDA device, else none); the result is ``app.state.engine.warmed_up``.

    Raises:
        ModelLoadError: the model or draft cannot be loaded, or the model's chat template cannot render a
            conversation (``code="invalid_chat_template"``).
        PolicyError: unknown default policy.
        InvalidRequestError: an invalid or unknown setting.
        SpecPrefillError: the warm-up request failed (``code="warmup_failed"``).
    """
    config = _config(config, settings)
    execution = None if config.compile is None else ExecutionSettings(compile=config.compile)
    draft_device = config.device
    owned: Backend | None = None  # a backend loaded here is closed here, at shutdown
    if backend is None:
        backend, draft_device = _load_backend(config, execution)
        owned = backend
    elif config.engine_args:
        raise InvalidRequestError(
            "engine_args configure the vLLM engine that create_app builds; it was given a backend",
            param="engine_args",
        )
    check_chat_template(backend)  # before the draft loads: a broken model folder fails at once
    if scorer is None:
        scorer = _default_scorer(backend, config, execution, draft_device)
    engine = ServingEngine(
        backend, scorer, config=config, tracer_provider=tracer_provider, meter_provider=meter_provider
    )
    warmup_tokens = config.warmup_tokens
    if warmup_tokens is None:
        warmup_tokens = default_warmup_tokens(backend, scorer, config.compile)
    if warmup_tokens:
        try:
            engine.warm_up(warmup_tokens)
        except BaseException:
            engine.shutdown()  # no app comes back: its worker threads go too
            raise
    keys = list(config.api_keys)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        sweeper = asyncio.create_task(_sweep_conversations(engine))
        try:
            yield
        finally:
            sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sweeper
            engine.shutdown()
            close = getattr(owned, "close", None)  # vLLM's engine processes and GPU memory
            if close is not None:
                close()

    app = FastAPI(
        title="specprefill-sdk server",
        version=__version__,
        description="OpenAI-compatible completions with speculative prefill. Per-request control through the "
        '`specprefill` object of the body; every error is `{"error": {message, type, param, code}}`.',
        lifespan=lifespan,
    )
    app.state.engine = engine
    app.openapi = functools.partial(_openapi, app)  # type: ignore[method-assign]
    install_error_handlers(app)
    # Without keys nothing but the Host header tells a local client from a web page that rebinds
    # its own name to this address.
    host_check = None if keys else HostCheck(ip_literals=not is_loopback_host(config.host))
    app.add_middleware(
        GuardMiddleware, max_body_bytes=config.max_body_bytes, api_key=keys or None, host_check=host_check
    )
    # Added last, so outermost: refusals before routing (401, 403, 413) carry the request id too.
    app.add_middleware(RequestIdMiddleware)
    # Declares the bearer scheme in the OpenAPI document; the key itself is checked by GuardMiddleware.
    security = [Depends(HTTPBearer(auto_error=False))] if keys else []
    router = APIRouter(prefix="/v1", dependencies=security, responses=_ERRORS)
    _add_routes(router, engine, keyed=bool(keys))
    _add_token_routes(router, engine)
    app.include_router(router)
    # vLLM serves tokenize and detokenize at the root: clients written for it find them there too.
    root = APIRouter(dependencies=security, responses=_ERRORS)
    _add_token_routes(root, engine)
    app.include_router(root)

    @app.head("/health", include_in_schema=False)
    async def health_head() -> Response:
        # Load balancers and uptime checks probe with HEAD: 200 and no body, as for GET.
        return Response(status_code=200)

    @app.get("/health", response_model=HealthResponse, tags=["server"])
    async def health() -> HealthResponse:
        """Liveness and load: requests in flight (running + queued), the queue depth, the scoring queue."""
        stats = engine.admission.stats()
        scoring = None
        if engine.scoring is not None:
            s = engine.scoring.stats()
            scoring = ScoringQueueReport(**dataclasses.asdict(s), mean_batch_size=s.mean_batch_size)
        return HealthResponse(
            model=engine.served_model,
            draft=engine.draft_name,
            in_flight=stats.in_flight,
            running=stats.running,
            queue_depth=stats.waiting,
            max_concurrency=stats.max_concurrency,
            max_queue=stats.max_queue,
            cancelled_streams=engine.cancelled_streams,
            cancelled_requests=engine.cancelled_requests,
            conversations=len(engine.conversations),
            warmup=None if engine.warmed_up is None else WarmUpReport(**dataclasses.asdict(engine.warmed_up)),
            load_warmup_seconds=_load_warmup_seconds(engine.backend, engine._base_scorer),
            scoring=scoring,
            engine_core=_engine_core(engine.backend),
        )

    _add_metrics_route(app, engine, keyed=bool(keys))
    return app


def _add_metrics_route(app: FastAPI, engine: ServingEngine, *, keyed: bool) -> None:
    metrics = engine.metrics
    if metrics is None:

        @app.get("/metrics", include_in_schema=False)
        async def metrics_off() -> Response:
            # Registered to say why, rather than the generic 404 of an unknown route.
            raise NotFoundError(
                "metrics are off on this server: start it with --metrics (SPECPREFILL_METRICS=1)",
                code="metrics_disabled",
            )

        return
    from .metrics import CONTENT_TYPE

    # Declares the bearer scheme in the OpenAPI document; the key itself is checked by GuardMiddleware.
    security = [Depends(HTTPBearer(auto_error=False))] if keyed else []

    @app.get(
        "/metrics",
        tags=["server"],
        dependencies=security,
        response_class=Response,
        responses={200: {"content": {CONTENT_TYPE: {"schema": {"type": "string"}}}, "description": "Metrics"}},
    )
    async def metrics_route() -> Response:
        """Prometheus metrics in the text format 0.0.4: vLLM's names where they apply, and ``specprefill:``."""
        return Response(content=metrics.exposition(), media_type=CONTENT_TYPE)


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's document without the 422 answers it declares for every body: this server answers 400."""
    if app.openapi_schema is None:
        schema = FastAPI.openapi(app)
        for operations in schema.get("paths", {}).values():
            for operation in operations.values():
                operation.get("responses", {}).pop("422", None)
        for name in ("HTTPValidationError", "ValidationError"):
            schema.get("components", {}).get("schemas", {}).pop(name, None)
    return app.openapi_schema or {}


def default_warmup_tokens(backend: Backend, scorer: Scorer | None, compile: bool | None = None) -> int:
    """`DEFAULT_WARMUP_TOKENS` when something compiles on a GPU, else 0.

    Something compiles when ``compile`` is True, or when the given backend's or scorer's
    `ExecutionSettings` compile on the backend's device (``compile=None``, the default, does on a
    CUDA device: `ExecutionSettings.compiles`); it is on a GPU when that device is a CUDA device.
    """
    if not isinstance(backend, LocalBackend) or backend.device.type != "cuda":
        return 0
    parts = (backend, scorer)
    compiles = compile is True or any(isinstance(p, Executed) and p.execution.compiles(backend.device) for p in parts)
    return DEFAULT_WARMUP_TOKENS if compiles else 0


def _engine_core(backend: Backend) -> Literal["in-process", "subprocess"] | None:
    """Where a vLLM backend's engine core runs (None: another backend)."""
    in_process = getattr(backend, "engine_in_process", None)
    if in_process is None:
        return None
    return "in-process" if in_process else "subprocess"


def _load_warmup_seconds(*parts: object) -> float | None:
    """Seconds the stages' own warm-ups took at load (`Pipeline.warmup`), or None: none ran."""
    reports = [p.warmed_up for p in parts if isinstance(p, Calibrated) and p.warmed_up is not None]
    return round(sum(r.seconds for r in reports), 3) if reports else None


async def _sweep_conversations(engine: ServingEngine) -> None:
    """Drop expired conversations now and then, so an idle server frees their caches too."""
    interval = min(30.0, max(0.5, engine.conversations.ttl_s / 2))
    while True:
        await asyncio.sleep(interval)
        engine.conversations.sweep()


def _load_backend(config: ServerConfig, execution: ExecutionSettings | None) -> tuple[Backend, str]:
    """The target ``config.engine`` names, and the device the draft should load on."""
    if config.engine == "transformers":
        from ..backends.transformers import TransformersBackend

        backend = TransformersBackend(config.model, device=config.device, dtype=config.dtype, execution=execution)
        return backend, config.device
    if config.device != "auto":
        raise InvalidRequestError(
            f"device={config.device!r} places the transformers engine's models; with engine='vllm' vLLM places "
            "the target and engine_args' draft_device the draft",
            param="device",
        )
    from ..backends.vllm import VLLMBackend

    options = config.engine_options
    vllm_backend = VLLMBackend(config.model, dtype=config.dtype, **options)
    return vllm_backend, vllm_backend.draft_device


def _default_scorer(
    backend: Backend, config: ServerConfig, execution: ExecutionSettings | None, device: str = "auto"
) -> Scorer:
    """The process's draft scorer: the default policy's, on the draft model (the target's by default)."""
    from ..policies import load_pipeline

    pipe = load_pipeline(
        config.policy,
        model=config.model,
        draft=config.draft,
        backend=backend,
        device=device,
        dtype=config.dtype,
        execution=execution,
    )
    return pipe.scorer


#: Keyword arguments of earlier versions of `create_app` whose `ServerConfig` field has another name.
_RENAMED_SETTINGS = {"api_key": "api_keys", "default_strategy": "session_strategy"}


def _config(config: ServerConfig | str | None, settings: dict[str, Any]) -> ServerConfig:
    """The configuration `create_app` was given, including the one-by-one keyword form of earlier versions."""
    if isinstance(config, str):  # create_app("model-name", ...): the model was the first argument
        settings = {"model": config, **settings}
        config = None
    if config is not None and not isinstance(config, ServerConfig):
        raise InvalidRequestError(f"create_app takes a ServerConfig, got {type(config).__name__}", param="config")
    if not settings:
        return config or ServerConfig()
    if config is not None:
        raise InvalidRequestError(
            f"give create_app a ServerConfig or its settings one by one, not both (got {', '.join(sorted(settings))})",
            param=sorted(settings)[0],
        )
    warnings.warn(
        "create_app(setting=...) is deprecated: build a ServerConfig(...) and call create_app(config)",
        DeprecationWarning,
        stacklevel=3,
    )
    values = {_RENAMED_SETTINGS.get(k, k): v for k, v in settings.items()}
    if values.get("api_keys") is None:
        values.pop("api_keys", None)
    if values.get("max_body_bytes") is None:
        values.pop("max_body_bytes", None)
    return ServerConfig.from_mapping(values)


# ----------------------------------------------------------------------------- routes
def _add_routes(router: APIRouter, engine: ServingEngine, *, keyed: bool) -> None:
    def owner(request: Request) -> str:
        # The key GuardMiddleware checked (never a header read again); without keys every caller
        # shares one space.
        if not keyed:
            return ""
        return key_owner(getattr(request.state, AUTHENTICATED_KEY))

    @router.get("/models", response_model=ModelList, tags=["models"])
    async def list_models() -> ModelList:
        """The served model, with the ``specprefill`` capability object."""
        return ModelList(data=[_model_card(engine)])

    @router.get("/models/{model_id}", response_model=ModelCard, tags=["models"])
    async def get_model(model_id: str) -> ModelCard:
        """One model card (404 for any other id)."""
        engine.check_model(model_id)
        return _model_card(engine)

    @router.post("/chat/completions", response_model=ChatCompletion, responses=_STREAM_DOC, tags=["completions"])
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        """Chat completion; the ``specprefill`` object controls compression for this request."""
        engine.check_model(body.model)
        messages = None
        if body.messages is not None:
            messages = [_message(m) for m in body.messages]
            engine.check_messages(messages)
        max_tokens = body.max_tokens or body.max_completion_tokens
        tools = [t.model_dump(exclude_none=True) for t in body.tools] if body.tools else None
        shape = _Shape(
            tools=tools is not None and body.tool_choice != "none",
            token_text=TokenText(engine.backend.tokenizer) if body.logprobs else None,
            kept_positions=_kept_positions(body),
        )
        options = body.specprefill
        if tools is not None and options is not None and (options.conversational or options.precompressed):
            where = "conversation_id" if options.conversational else "prompt_token_ids"
            raise _invalid(
                f"tools are rendered into messages by the chat template: they are not served with specprefill.{where}",
                "tools",
            )
        if options is not None and options.conversational:
            return await _serve_turn(engine, request, body, messages, max_tokens, owner(request), shape)
        return await _serve(engine, request, body, messages, "chat", max_tokens, shape, tools)

    @router.post("/completions", response_model=TextCompletion, responses=_STREAM_DOC, tags=["completions"])
    async def completions(body: CompletionRequest, request: Request) -> Response:
        """Text completion of ``prompt`` (text or token ids), no chat template."""
        engine.check_model(body.model)
        shape = _Shape(
            token_text=TokenText(engine.backend.tokenizer) if body.logprobs is not None else None,
            kept_positions=_kept_positions(body),
        )
        return await _serve(engine, request, body, _completion_prompt(body.prompt), "text", body.max_tokens, shape)

    @router.get("/conversations/{conversation_id}", response_model=ConversationObject, tags=["conversations"])
    async def get_conversation(conversation_id: str, request: Request) -> ConversationObject:
        """A stored conversation: its messages and what each turn prefilled (does not extend its TTL)."""
        entry = engine.conversations.peek(owner(request), conversation_id)
        conversation = entry.conversation
        assert conversation is not None
        return ConversationObject(
            id=entry.id,
            created=int(entry.created),
            last_used=int(entry.last_used),
            expires_in=round(engine.conversations.expires_in(entry), 3),
            strategy=conversation.strategy,
            messages=[ConversationMessage(role=m.role, content=m.content) for m in conversation.history],
            turns=[
                ConversationTurn(**{k: v for k, v in t.as_dict().items() if k in ConversationTurn.model_fields})
                for t in conversation.turns
            ],
        )

    @router.delete("/conversations/{conversation_id}", response_model=ConversationDeleted, tags=["conversations"])
    async def delete_conversation(conversation_id: str, request: Request) -> ConversationDeleted:
        """End a stored conversation now and free its caches (409 while it answers a request)."""
        engine.conversations.delete(owner(request), conversation_id)
        return ConversationDeleted(id=conversation_id)


def _add_token_routes(router: APIRouter, engine: ServingEngine) -> None:
    @router.post("/tokenize", response_model=TokenizeResponse, tags=["tokens"])
    async def tokenize(body: TokenizeRequest, request: Request) -> TokenizeResponse:
        """The target's token ids for ``messages`` (chat template applied) or ``prompt``, as vLLM's route."""
        engine.check_model(body.model)
        if (body.messages is None) == (body.prompt is None):
            raise _invalid("give exactly one of messages or prompt", "messages")
        # The template writes a chat's special tokens; a text prompt gets the tokenizer's (vLLM's defaults).
        special = body.prompt is not None
        if body.add_special_tokens is not None and body.add_special_tokens != special:
            raise InvalidRequestError(
                f"add_special_tokens={str(body.add_special_tokens).lower()} is not served for "
                f"{'a prompt' if special else 'messages'}: the ids are those the target prefills; leave it out",
                param="add_special_tokens",
                code="unsupported_parameter",
            )
        ctx = RequestContext(request.headers)
        prompt_input: PromptInput
        if body.prompt is not None:
            prompt_input = body.prompt
        else:
            messages = [_message(m) for m in body.messages or []]
            engine.check_messages(messages)
            prompt_input = messages
        tools = [t.model_dump(exclude_none=True) for t in body.tools] if body.tools else None

        def run() -> Prompt:
            from ..prompt import build_prompt

            return build_prompt(
                engine.backend.tokenizer, prompt_input, add_generation_prompt=body.add_generation_prompt, tools=tools
            )

        ticket = await engine.admission.acquire()
        try:
            prompt = await engine.call(ctx, run)
        finally:
            engine.admission.release(ticket)
        tokens = list(prompt.token_ids)
        strs = engine.backend.tokenizer.convert_ids_to_tokens(tokens) if body.return_token_strs else None
        return TokenizeResponse(
            tokens=tokens,
            count=len(tokens),
            max_model_len=engine.max_context,
            token_strs=strs,
            model=engine.served_model,
        )

    @router.post("/detokenize", response_model=DetokenizeResponse, tags=["tokens"])
    async def detokenize(body: DetokenizeRequest) -> DetokenizeResponse:
        """The text of ``tokens`` (special tokens included), as vLLM's route."""
        engine.check_model(body.model)
        bad = next((i for i, t in enumerate(body.tokens) if not 0 <= t < engine.vocab_size), None)
        if bad is not None:
            raise InvalidRequestError(
                f"token id {body.tokens[bad]} is outside the vocabulary [0, {engine.vocab_size})",
                param=f"tokens.{bad}",
            )
        return DetokenizeResponse(prompt=engine.backend.tokenizer.decode(body.tokens))


def _model_card(engine: ServingEngine) -> ModelCard:
    return ModelCard(
        id=engine.served_model,
        created=0,
        max_model_len=engine.max_context,
        specprefill=SpecPrefillCapability(
            version=__version__,
            position_ids=True,
            draft=engine.draft_name,
            default_policy=engine.default_policy,
            policies=engine.policies,
            max_context=engine.max_context,
            vocab_size=engine.vocab_size,
            options=sorted(SpecPrefillOptions.model_fields),
            conversations=ConversationCapability(
                strategies=list(STRATEGIES),
                default_strategy=engine.default_strategy,
                ttl_s=engine.conversations.ttl_s,
                max_conversations=engine.conversations.max_conversations,
                max_conversations_per_key=engine.conversations.max_per_owner,
            )
            if engine.conversations.enabled
            else None,
        ),
    )


def _invalid(message: str, param: str | None) -> SpecPrefillError:
    from ..errors import InvalidRequestError

    return InvalidRequestError(message, param=param)


def _content(content: Any) -> Any:
    if content is None:
        return ""
    if isinstance(content, list):
        return [part.model_dump(exclude_none=True) for part in content]
    return content


def _message(message: ChatMessage) -> dict[str, Any]:
    """A request message as `Message.coerce` reads it, its tool calls and tool call id included."""
    out: dict[str, Any] = {"role": message.role, "content": _content(message.content)}
    if message.tool_calls:
        out["tool_calls"] = [call.model_dump() for call in message.tool_calls]
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    return out


@dataclasses.dataclass(frozen=True)
class _Shape:
    """What a request asks of its answer's choices beyond the text: tool calls parsed out, logprobs."""

    #: parse Hermes/Qwen tool calls out of the text (tools given, tool_choice not "none")
    tools: bool = False
    #: write each token's log-probabilities, with this tokenizer's token texts (None: not asked for)
    token_text: TokenText | None = None
    #: add the kept prompt positions to usage.specprefill (specprefill.return_kept_positions)
    kept_positions: bool = False


def _kept_positions(body: ChatCompletionRequest | CompletionRequest) -> bool:
    """Whether ``body`` asks for its kept positions; refused on a stream without a usage chunk to carry them."""
    asked = bool(body.specprefill and body.specprefill.return_kept_positions)
    if asked and body.stream and not (body.stream_options and body.stream_options.include_usage):
        raise _invalid(
            "specprefill.return_kept_positions on a stream needs stream_options.include_usage: the positions "
            "travel in the usage chunk",
            "specprefill.return_kept_positions",
        )
    return asked


def _completion_prompt(prompt: Any) -> PromptInput | Prompt | None:
    if prompt is None:
        return None
    if isinstance(prompt, str):
        return prompt
    if not prompt:
        raise _invalid("the prompt is empty", "prompt")
    if all(isinstance(p, int) for p in prompt):
        return Prompt.from_token_ids(prompt)
    if len(prompt) != 1:
        raise _invalid("one prompt per request is served (got a list of several)", "prompt")
    only = prompt[0]
    if isinstance(only, str):
        return only
    if not only:
        raise _invalid("the prompt is empty", "prompt")
    return Prompt.from_token_ids(only)


def _sampling(body: ChatCompletionRequest | CompletionRequest, max_tokens: int | None) -> dict[str, Any]:
    """The request's sampling fields, as the engine resolves them into `SamplingParams`."""
    stops = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    logprobs = body.top_logprob_count if isinstance(body, ChatCompletionRequest) else body.logprobs
    return {
        "max_tokens": max_tokens,
        "temperature": body.temperature,
        "top_p": body.top_p,
        "stop": tuple(stops),
        "seed": body.seed,
        "ignore_eos": body.ignore_eos,
        "logprobs": logprobs,
    }


async def _serve(
    engine: ServingEngine,
    request: Request,
    body: ChatCompletionRequest | CompletionRequest,
    prompt_input: PromptInput | Prompt | None,
    kind: Literal["chat", "text"],
    max_tokens: int | None,
    shape: _Shape,
    tools: list[dict[str, Any]] | None = None,
) -> Response:
    sampling = _sampling(body, max_tokens)
    options = body.specprefill
    return_ids = bool(options and options.return_token_ids)
    ctx = RequestContext(request.headers, request_arrived(request))
    rid = request_id(request)
    handle: StreamHandle | None = None
    async with _Departure(request, engine, ctx) as departure:
        ticket = await departure.admitted()
        try:
            prepared = await engine.call(ctx, engine.prepare, prompt_input, options, sampling, tools)
            if not body.stream:
                completion = await departure.run(engine.run_generate, prepared)
                engine.finished(ctx, ticket, prepared, completion)
                ctx.times.add("server", elapsed_ms(ctx.arrived))
                payload = _response(kind, engine.served_model, completion, return_ids, rid, shape=shape, ctx=ctx)
                return JSONResponse(payload)
            # A stream learns of a disconnect from its response, once that begins.
            iterator = await departure.run(engine.open_stream, prepared)
            handle = StreamHandle(engine, ctx, iterator, ticket, prepared)
        finally:
            if handle is None:
                engine.admission.release(ticket)
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    keepalive = engine.config.keepalive_interval
    events = _events(
        handle, kind, engine.served_model, include_usage, return_ids, rid, keepalive, engine.drain, shape=shape
    )
    return _ClosingStreamingResponse(
        events,
        handle.aclose,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


async def _serve_turn(
    engine: ServingEngine,
    request: Request,
    body: ChatCompletionRequest,
    messages: list[dict[str, Any]] | None,
    max_tokens: int | None,
    owner: str,
    shape: _Shape,
) -> Response:
    """A turn of a conversation kept on the server: start it, or continue it with the new message."""
    options = body.specprefill
    assert options is not None
    store = engine.conversations
    if not store.enabled:
        raise _invalid("this server keeps no conversations (--max-sessions 0)", "specprefill.conversation_id")
    if not options.conversation_start and options.conversation_id is None:
        raise _invalid(
            "give specprefill.conversation_id to continue a conversation, or conversation_start to begin one",
            "specprefill.conversation_id",
        )
    sampling = _sampling(body, max_tokens)
    ctx = RequestContext(request.headers, request_arrived(request))
    # Claimed on the event loop, before any await: a second request for it sees it busy (409).
    if options.conversation_start:
        entry = store.reserve(owner, options.conversation_id or new_conversation_id())
    else:
        assert options.conversation_id is not None
        entry = store.claim(owner, options.conversation_id)
    headers = {"X-Conversation-Id": entry.id}
    handle: StreamHandle | None = None
    try:
        async with _Departure(request, engine, ctx) as departure:
            ticket = await departure.admitted()
            try:
                turn = await engine.call(ctx, engine.begin_turn, entry, options, messages, sampling)
                if not body.stream:
                    completion = await departure.run(engine.run_turn, turn)
                    engine.finished(ctx, ticket, turn, completion)
                    ctx.times.add("server", elapsed_ms(ctx.arrived))
                    payload = _response(
                        "chat",
                        engine.served_model,
                        completion,
                        options.return_token_ids,
                        request_id(request),
                        turn,
                        shape,
                        ctx,
                    )
                    return JSONResponse(payload, headers=headers)
                iterator = await departure.run(engine.open_turn_stream, turn)
                handle = StreamHandle(engine, ctx, iterator, ticket, turn, on_close=lambda: store.release(entry))
            finally:
                if handle is None:
                    engine.admission.release(ticket)
    finally:
        if handle is None:
            store.release(entry)
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    events = _events(
        handle,
        "chat",
        engine.served_model,
        include_usage,
        options.return_token_ids,
        request_id(request),
        engine.config.keepalive_interval,
        engine.drain,
        turn,
        shape,
    )
    return _ClosingStreamingResponse(
        events,
        handle.aclose,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **headers},
    )


# ----------------------------------------------------------------------------- response shapes
class _Departure:
    """Watches a request's receive channel while its answer is being made, for a client that leaves.

    A JSON answer is sent only at the end, and a stream's response begins only after its prefill,
    so until then nothing else would notice a disconnect (the request's body was read before).
    When the client leaves, the request is cancelled (`ServingEngine.cancel`): a request still
    waiting for a slot gives up its place in the queue, a prompt waiting to be scored is dropped,
    and a generation stops at its next token (the transformers backend's ``generate`` and
    `ServingEngine.run_turn` read the request's cancel event); `ServingEngine.left` records it.
    """

    def __init__(self, request: Request, engine: ServingEngine, ctx: RequestContext) -> None:
        self._request = request
        self._engine = engine
        self._ctx = ctx
        self._watcher: asyncio.Task[None] | None = None

    async def __aenter__(self) -> _Departure:
        self._watcher = asyncio.create_task(self._watch())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._watcher is not None
        self._watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._watcher

    async def _watch(self) -> None:
        while (await self._request.receive())["type"] != "http.disconnect":
            pass
        self._engine.cancel(self._ctx)

    async def admitted(self) -> Ticket:
        """A slot (`Admission.acquire`), unless the client leaves first (`RequestCancelledError`)."""
        assert self._watcher is not None
        acquire = asyncio.ensure_future(self._engine.admission.acquire())
        try:
            await asyncio.wait({acquire, self._watcher}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # this request's task was cancelled: its place in the queue goes too
            acquire.cancel()
            raise
        gave_up = not acquire.done()
        if gave_up:
            acquire.cancel()
        try:
            ticket = await acquire
        except asyncio.CancelledError:
            if not gave_up:
                raise
            self._engine.left()
            raise RequestCancelledError("the client went away while its request waited for a slot") from None
        if self._ctx.cancelled.is_set():
            self._engine.admission.release(ticket)
            self._engine.left()
            raise RequestCancelledError("the client went away while its request waited for a slot")
        self._ctx.times.add("admit", elapsed_ms(self._ctx.arrived))  # usage.specprefill.admit_ms
        return ticket

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on a model worker (`ServingEngine.until_grace_over`); a request stopped because its
        client left is recorded."""
        try:
            return await self._engine.until_grace_over(self._ctx, self._engine.call(self._ctx, fn, *args))
        except RequestCancelledError as exc:
            self._engine.left(exc.generated if isinstance(exc, GenerationStopped) else 0)
            raise


def _usage(
    completion: Completion, turn: Turn | None = None, ctx: RequestContext | None = None, positions: bool = False
) -> UsageInfo:
    usage = completion.usage
    selection = completion.selection
    conversation: ConversationUsage | None = ServingEngine.turn_usage(turn) if turn is not None else None
    times = ctx.times if ctx is not None else None
    server = times.get("server") if times is not None else None
    timings = completion.timings
    return UsageInfo(
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
        total_tokens=usage.total_tokens,
        specprefill=SpecPrefillUsage(
            kept_tokens=usage.kept_tokens,
            keep_ratio=usage.keep_ratio,
            score_ms=timings.score,
            prefill_ms=timings.prefill,
            select_ms=timings.select,
            ttft_ms=timings.ttft,
            admit_ms=times.get("admit") if times is not None else None,
            tokenize_ms=times.get("tokenize") if times is not None else None,
            queue_ms=times.get("queue") if times is not None else None,
            submit_ms=times.get("submit") if times is not None else None,
            server_ms=server,
            host_ms=None if server is None else server - timings.score - timings.prefill,
            fallback=completion.fallback,
            reason=selection.reason if selection is not None else None,
            kept_positions=list(selection.indices) if positions and selection is not None else None,
            conversation=conversation,
        ),
    )


def _response(
    kind: str,
    model: str,
    completion: Completion,
    return_ids: bool,
    rid: str,
    turn: Turn | None = None,
    shape: _Shape = _Shape(),
    ctx: RequestContext | None = None,
) -> dict[str, Any]:
    ids = list(completion.token_ids) if return_ids else None
    created = int(time.time())
    usage = _usage(completion, turn, ctx, shape.kept_positions).model_dump()
    token_text, entries = shape.token_text, completion.logprobs
    if kind == "chat":
        message: dict[str, Any] = {"role": "assistant", "content": completion.text}
        finish: str = completion.finish_reason
        if shape.tools:
            content, calls = parse_tool_calls(completion.text)
            if calls:
                message = {"role": "assistant", "content": content, "tool_calls": [c.to_dict() for c in calls]}
                finish = "tool_calls"
        choice: dict[str, Any] = {
            "index": 0,
            "message": message,
            "finish_reason": finish,
            "logprobs": None if entries is None or token_text is None else chat_logprobs(entries, token_text),
        }
        obj, prefix = "chat.completion", "chatcmpl"
    else:
        logprobs = None if entries is None or token_text is None else completion_logprobs(entries, token_text)
        choice = {"index": 0, "text": completion.text, "finish_reason": completion.finish_reason, "logprobs": logprobs}
        obj, prefix = "text_completion", "cmpl"
    if ids is not None:
        choice["token_ids"] = ids
    return {
        "id": _completion_id(prefix, rid),
        "object": obj,
        "created": created,
        "model": model,
        "choices": [choice],
        "usage": usage,
        "system_fingerprint": None,
    }


#: An SSE comment line: it keeps a silent connection alive and every SSE client skips it.
KEEP_ALIVE = ": keep-alive\n\n"


def _sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"


def _completion_id(prefix: str, rid: str) -> str:
    """``chatcmpl-<request id>`` (or ``cmpl-``), as vLLM names completions; a new id outside a request."""
    return f"{prefix}-{rid or uuid.uuid4().hex}"


async def _events(
    handle: StreamHandle,
    kind: str,
    model: str,
    include_usage: bool,
    return_ids: bool,
    rid: str,
    keepalive: float,
    drain: Drain,
    turn: Turn | None = None,
    shape: _Shape = _Shape(),
) -> AsyncGenerator[str, None]:
    """OpenAI's SSE chunks: a role chunk (chat), text deltas, a finish chunk, the usage chunk, [DONE].

    With tools, text goes through a `ToolCallParser`: content deltas, and each call whole in a
    ``delta.tool_calls`` chunk; the finish reason is then ``tool_calls``. With logprobs, each
    step's chunk carries its token's.

    While a chunk takes longer than ``keepalive`` seconds (scoring and prefill of a long prompt
    before the first), an SSE comment (`KEEP_ALIVE`) goes out every ``keepalive`` seconds: proxies
    close connections that stay silent, and SSE clients skip comment lines.

    A stream still running when the shutdown's grace period is over (``drain``) ends with an error
    event (`ShuttingDownError`'s body) and ``[DONE]``, so that its client can tell it from a
    finished answer and from a broken connection.
    """
    created = int(time.time())
    prefix, obj = ("chatcmpl", "chat.completion.chunk") if kind == "chat" else ("cmpl", "text_completion")
    base = {
        "id": _completion_id(prefix, rid),
        "object": obj,
        "created": created,
        "model": model,
        "system_fingerprint": None,
    }

    parser = ToolCallParser() if shape.tools else None
    offset = 0  # text_offset of the next token (completions' logprobs)

    def logprobs_of(entries: tuple[TokenLogprob, ...]) -> dict[str, Any] | None:
        nonlocal offset
        if shape.token_text is None or not entries:
            return None
        if kind == "chat":
            return chat_logprobs(entries, shape.token_text)
        out = completion_logprobs(entries, shape.token_text, offset)
        offset = out["text_offset"][-1] + len(out["tokens"][-1])
        return out

    def chunk(
        text: str | None,
        finish: str | None,
        ids: tuple[int, ...] = (),
        role: bool = False,
        calls: list[dict[str, Any]] | None = None,
        logprobs: dict[str, Any] | None = None,
    ) -> str:
        if kind == "chat":
            delta: dict[str, Any] = {"role": "assistant"} if role else {}
            if text is not None:
                delta["content"] = text
            if calls:
                delta["tool_calls"] = calls
            choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": logprobs}
        else:
            choice = {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": logprobs}
        if return_ids and ids:
            choice["token_ids"] = list(ids)
        payload = {**base, "choices": [choice]}
        if include_usage:
            payload["usage"] = None
        return _sse(payload)

    completion: Completion | None = None
    first = True
    over = asyncio.ensure_future(drain.over())
    try:
        if kind == "chat":
            yield chunk("", None, role=True)
        while True:
            step = asyncio.ensure_future(handle.next())
            try:
                while not (await asyncio.wait({step, over}, timeout=keepalive, return_when=asyncio.FIRST_COMPLETED))[0]:
                    yield KEEP_ALIVE
            finally:
                if not step.done():  # the client went away, or the grace is over: the worker's step finishes
                    step.cancel()  # under the stream's lock
            if not step.done() or step.cancelled():
                raise ShuttingDownError(
                    f"the server shut down before this stream finished (it waits {drain.grace_s:g} s for running "
                    "requests); retry later"
                )
            piece = step.result()
            if piece is None:
                break
            # A chunk for every generated step, its text empty while the detokenizer holds back an
            # incomplete character: clients and load generators time the first token by the first
            # chunk, and vLLM sends one per step too.
            if piece.text or piece.token_ids:
                if first:  # the server's time to the first token: from arrival to this chunk's hand-off
                    handle.ctx.times.add("server", elapsed_ms(handle.ctx.arrived))
                    first = False
                if parser is None:
                    yield chunk(piece.text, None, piece.token_ids, logprobs=logprobs_of(piece.logprobs))
                else:
                    text, calls = _parsed(parser, parser.feed(piece.text))
                    yield chunk(text, None, piece.token_ids, calls=calls, logprobs=logprobs_of(piece.logprobs))
            if piece.finish_reason is not None:
                completion = piece.completion
                finish: str = piece.finish_reason
                if parser is not None:
                    text, calls = _parsed(parser, parser.finish())
                    if text or calls:
                        yield chunk(text, None, calls=calls)
                    if parser.calls:
                        finish = "tool_calls"
                yield chunk(None if kind == "chat" else "", finish)
        if include_usage and completion is not None:
            usage = _usage(completion, turn, handle.ctx, shape.kept_positions)
            yield _sse({**base, "choices": [], "usage": usage.model_dump()})
        yield "data: [DONE]\n\n"
    except ShuttingDownError as exc:
        logger.info("a stream was ended by the shutdown (request %s)", rid)
        yield _sse(exc.to_openai())
        yield "data: [DONE]\n\n"
    except SpecPrefillError as exc:
        yield _sse(exc.to_openai())
    except Exception:
        logger.exception("a stream failed (request %s)", rid)
        yield _sse(error_body("the server failed while generating", "server_error", code="internal_error"))
    finally:
        over.cancel()


def _parsed(parser: ToolCallParser, pieces: list[str | ToolCall]) -> tuple[str | None, list[dict[str, Any]]]:
    """A parser's released pieces as one content delta (None when only calls) and ``delta.tool_calls``."""
    text = "".join(p for p in pieces if isinstance(p, str))
    calls = [p for p in pieces if not isinstance(p, str)]
    first = len(parser.calls) - len(calls)
    deltas = [{"index": first + i, **call.to_dict()} for i, call in enumerate(calls)]
    return (text if text or not calls else None), deltas


class _ClosingStreamingResponse(StreamingResponse):
    """A streaming response that always runs ``on_close`` (stop generating, free the slot).

    It runs whether the body finished, the client went away mid-stream, or sending never began.
    """

    def __init__(self, content: AsyncIterator[str], on_close: Callable[[], Awaitable[None]], **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self._on_close()
