"""`ServerConfig`: every setting of the server, validated once; `specprefill serve` builds one.

The configuration holds plain values only (names, numbers, switches), so that it can be written in
a file or the environment and compared; the objects a process builds from it (the backend, the
scorer, telemetry providers) are given to `create_app` beside it.

Example::

    from specprefill_sdk.server import ServerConfig, create_app

    app = create_app(ServerConfig(model="smollm2-135m", policy="paper", api_keys=("secret",)))
"""

from __future__ import annotations

import dataclasses
import difflib
import ipaddress
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import InvalidRequestError
from ..validation import check_float, check_int, check_known
from . import DEFAULT_MAX_SESSIONS, DEFAULT_SESSION_STRATEGY, DEFAULT_SESSION_TTL

__all__ = [
    "DEFAULT_CONCURRENCY",
    "DEFAULT_HEADER_TIMEOUT",
    "DEFAULT_KEEPALIVE_INTERVAL",
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_SCORING_WAIT_MS",
    "DEFAULT_SHUTDOWN_GRACE",
    "ENGINES",
    "ENV_PREFIX",
    "LOG_LEVELS",
    "OTHER_VARIABLES",
    "STRATEGIES",
    "ServerConfig",
    "env_name",
    "env_values",
    "is_loopback_host",
    "misspelt_variables",
]

logger = logging.getLogger(__name__)

#: Largest request body accepted (413 above it): ample for prompts at any context we serve.
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
#: ``scoring_wait_ms`` by default: a few milliseconds, well below one scoring call of a draft.
DEFAULT_SCORING_WAIT_MS = 5.0
#: Seconds a stream may wait for its next piece (scoring and prefill of a long prompt) before the
#: server sends an SSE comment, so that proxies do not close a connection they think idle.
DEFAULT_KEEPALIVE_INTERVAL = 10.0
#: Seconds a connection may take to send a request's head (request line and headers): ample for any
#: client on a slow network, short enough that connections that never finish theirs do not pile up.
DEFAULT_HEADER_TIMEOUT = 15.0
#: HTTP connections served at once: well above what the engines run and queue (vLLM's 256 and the
#: queue) plus clients' idle kept-alive connections, and well below the 1024 open files that many
#: systems allow a process by default.
DEFAULT_MAX_CONNECTIONS = 512
#: Seconds that requests running at shutdown (SIGTERM) get to finish: most answers and streams end
#: within it, and with the few seconds the server needs to close after it, it stays within the 30 s
#: that Kubernetes and systemd give a process before they kill it.
DEFAULT_SHUTDOWN_GRACE = 20.0
#: The prefix of the environment variables `ServerConfig.from_env` reads.
ENV_PREFIX = "SPECPREFILL_"
#: uvicorn's log levels, for ``log_level``.
LOG_LEVELS = ("critical", "error", "warning", "info", "debug")
#: `Conversation`'s strategies, restated so that reading a configuration loads no model code.
STRATEGIES = ("recompute", "incremental", "refresh")
#: Where the target runs: in this process with transformers, or in vLLM's engine.
ENGINES = ("transformers", "vllm")
#: The project's other ``SPECPREFILL_*`` variables (not `ServerConfig` fields), and who reads each.
OTHER_VARIABLES: dict[str, str] = {
    "SPECPREFILL_CACHE": "models.cache_dir: where converted models live",
    "SPECPREFILL_VLLM_PLUGIN": "backends.vllm.plugin: which architectures the vLLM plugin registers",
    "SPECPREFILL_OTEL": "specprefill serve --otel",
    "SPECPREFILL_API_BASE": "the litellm proxy example's configuration",
}
#: ``max_concurrency`` when none is given, per engine: the transformers backend decodes one request
#: at a time, vLLM batches as many requests as its scheduler admits (its own ``max_num_seqs``).
DEFAULT_CONCURRENCY = {"transformers": 1, "vllm": 256}


@dataclass(frozen=True)
class ServerConfig:
    """The server's settings; invalid values raise `InvalidRequestError` naming the field.

    Field names are those of ``specprefill serve``'s options (``--max-queue`` is ``max_queue``), so
    that every setting has one name on the command line, in Python and in a deployment's variables.

    Attributes:
        model: the target model spec (unused when `create_app` is given a backend).
        draft: the draft model spec; None: the target itself (weights shared).
        policy: the default policy preset; requests may pick another with ``specprefill.policy``.
        api_keys: when any, every ``/v1`` route needs ``Authorization: Bearer <key>``; each key sees
            only the conversations started with it.
        max_prompt_tokens: longer prompts get 413 (None: the model's context).
        max_output_tokens: requests asking for more tokens get 400 (and a request that names none is
            given at most this many).
        max_concurrency: requests doing model work at once (worker threads); None: the engine's
            default (`DEFAULT_CONCURRENCY`: 1 for transformers, vLLM's ``max_num_seqs`` or 256 for vLLM).
        max_queue: requests allowed to wait; more get 429 with ``Retry-After``.
        max_body_bytes: larger request bodies get 413.
        default_max_tokens: ``max_tokens`` of a request that names none; None (the default): what the
            context leaves after the prompt, as vLLM does. Either is capped by ``max_output_tokens``
            and by the context.
        served_model_name: the model id clients send and ``GET /v1/models`` lists (None: the model's).
        device, dtype: where and how models given by name are loaded.
        keepalive_interval: seconds a stream may send nothing (while the prompt is scored and
            prefilled) before the server sends an SSE comment line, ``: keep-alive``; clients ignore it.
        session_ttl: seconds a conversation kept on the server may stay idle before it expires.
        max_sessions: conversations kept at once (the least recently used idle one is evicted for a
            new one; 0: conversations are not served).
        max_sessions_per_key: conversations one API key may hold at once, so that one key can neither
            fill the store nor evict the others' conversations; a key's start beyond it evicts that
            key's own least recently used idle one. None (the default): ``max_sessions`` shared out
            evenly among ``api_keys`` (rounded up), the whole store without keys or with one.
        session_strategy: the strategy of a conversation whose first request names none.
        compile: build the backend and the draft scorer compiled (`ExecutionSettings.compile`):
            None (the default) compiles on a CUDA device and not elsewhere, False never; the
            passes compile at start (`Pipeline.warmup`), not in a first request.
        warmup_tokens: serve one request of this many prompt tokens before accepting any, so that
            compiling happens at start (`ServingEngine.warm_up`); 0: none; None: `default_warmup_tokens`.
        metrics: serve Prometheus metrics at ``GET /metrics`` (``specprefill_sdk.server.metrics``); off:
            that route answers 404. With ``api_keys`` it needs a key, as the ``/v1`` routes do.
        scoring_queue: score the draft's prompts of concurrent requests through one queue, in arrival
            order (`specprefill_sdk.scoring.ScoringQueue`), batched with ``scoring_batch_tokens``; None:
            on when ``max_concurrency`` is above 1.
        scoring_batch_tokens: the most prompt tokens one scoring batch holds; a longer prompt is
            scored alone. None (the default): every prompt alone, so that a prompt's selection does
            not depend on what else was scored with it (a batch's rounding can change it); set it
            (e.g. 16384, the draft's ``ExecutionSettings.max_batch_tokens``) to batch concurrent prompts.
        scoring_wait_ms: with ``scoring_batch_tokens``, how long a scoring batch waits for more prompts
            while other requests run (a request alone on the server never waits).
        host, port, log_level: where ``specprefill serve`` listens and how much uvicorn logs
            (`create_app` builds the application only).
        header_timeout: seconds a connection may take to send a request's head (after it opened, or
            after the previous answer on it); then it is closed (with 408 when part of a head came).
            Read by ``specprefill serve`` (`specprefill_sdk.server.listener`).
        max_connections: HTTP connections served at once; a connection beyond them is answered 503
            (``too_many_connections``, ``Retry-After``) and closed. Read by ``specprefill serve``.
        shutdown_grace: seconds the requests running at shutdown get to finish. From the start of the
            shutdown, queued and new requests get 503 (``server_shutting_down``, ``Retry-After``);
            what still runs after the grace ends: a stream with an SSE error event and ``[DONE]``, a
            JSON request with 503.
        engine: ``"transformers"`` (the target in this process) or ``"vllm"`` (the target in vLLM's
            engine, continuous batching; the draft on the GPU in this process; see docs/vllm.md).
        engine_args: vLLM engine options (`vllm.EngineArgs` names: ``max_model_len``,
            ``gpu_memory_utilization``, ``tensor_parallel_size``, ``max_num_seqs``, ``enforce_eager``,
            ``load_format``, ...), passed through to vLLM, plus `VLLMBackend`'s own ``draft_device``,
            ``draft_memory_gib`` and ``engine_core``; only with ``engine="vllm"``. Stored as sorted
            ``(name, value)`` pairs; `engine_options` gives them as a dict.
    """

    model: str = "smollm2-135m"
    draft: str | None = None
    policy: str = "auto"
    api_keys: tuple[str, ...] = field(default=())
    max_prompt_tokens: int | None = None
    max_output_tokens: int | None = None
    max_concurrency: int | None = None
    max_queue: int = 16
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    default_max_tokens: int | None = None
    served_model_name: str | None = None
    device: str = "auto"
    dtype: str = "auto"
    keepalive_interval: float = DEFAULT_KEEPALIVE_INTERVAL
    session_ttl: float = DEFAULT_SESSION_TTL
    max_sessions: int = DEFAULT_MAX_SESSIONS
    max_sessions_per_key: int | None = None
    session_strategy: str = DEFAULT_SESSION_STRATEGY
    compile: bool | None = None
    warmup_tokens: int | None = None
    metrics: bool = False
    scoring_queue: bool | None = None
    scoring_batch_tokens: int | None = None
    scoring_wait_ms: float = DEFAULT_SCORING_WAIT_MS
    host: str = "127.0.0.1"
    port: int = 8000
    log_level: str = "info"
    header_timeout: float = DEFAULT_HEADER_TIMEOUT
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    shutdown_grace: float = DEFAULT_SHUTDOWN_GRACE
    engine: str = "transformers"
    engine_args: tuple[tuple[str, Any], ...] = field(default=())

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise InvalidRequestError(
                f"engine must be one of {', '.join(ENGINES)}, got {self.engine!r}", param="engine"
            )
        object.__setattr__(self, "engine_args", _engine_args(self.engine_args, self.engine))
        if self.max_concurrency is None:
            default = DEFAULT_CONCURRENCY[self.engine]
            if self.engine == "vllm":
                default = self.engine_options.get("max_num_seqs", default)
            object.__setattr__(self, "max_concurrency", default)
        for name in ("model", "policy", "device", "dtype", "host"):
            _check_text(getattr(self, name), name)
        for name in ("draft", "served_model_name"):
            if getattr(self, name) is not None:
                _check_text(getattr(self, name), name)
        keys = self.api_keys
        if isinstance(keys, str):  # one key given as a string, not its characters
            keys = (keys,)
        if not isinstance(keys, tuple | list) or not all(isinstance(k, str) for k in keys):
            raise InvalidRequestError(f"api_keys must be a sequence of strings, got {keys!r}", param="api_keys")
        for key in keys:
            # An empty key is what `--api-key "$KEY"` gives when KEY is unset: dropping it would
            # serve every route without authentication, which nobody who gave a key meant.
            if not key.strip():
                raise InvalidRequestError(
                    "an API key is empty (an unset variable?): give a non-empty key, or no api_keys at all "
                    "to serve without authentication",
                    param="api_keys",
                )
            if key != key.strip():
                raise InvalidRequestError(
                    "an API key starts or ends with whitespace; clients' keys are compared without it",
                    param="api_keys",
                )
        object.__setattr__(self, "api_keys", tuple(keys))
        for name in ("max_prompt_tokens", "max_output_tokens", "default_max_tokens", "max_sessions_per_key"):
            if getattr(self, name) is not None:
                check_int(getattr(self, name), name, param=name, minimum=1)
        for name, minimum in (
            ("max_concurrency", 1),
            ("max_queue", 0),
            ("max_body_bytes", 1),
            ("max_sessions", 0),
            ("max_connections", 1),
            ("port", 0),
        ):
            check_int(getattr(self, name), name, param=name, minimum=minimum)
        if self.port > 65535:
            raise InvalidRequestError(f"port must be at most 65535, got {self.port}", param="port")
        if self.warmup_tokens is not None:
            check_int(self.warmup_tokens, "warmup_tokens", param="warmup_tokens", minimum=0)
        if self.scoring_queue is not None and not isinstance(self.scoring_queue, bool):
            raise InvalidRequestError(
                f"scoring_queue must be true, false or None, got {self.scoring_queue!r}", param="scoring_queue"
            )
        if self.scoring_batch_tokens is not None:
            check_int(self.scoring_batch_tokens, "scoring_batch_tokens", param="scoring_batch_tokens", minimum=1)
        object.__setattr__(
            self, "scoring_wait_ms", check_float(self.scoring_wait_ms, "scoring_wait_ms", param="scoring_wait_ms")
        )
        object.__setattr__(
            self, "session_ttl", check_float(self.session_ttl, "session_ttl", param="session_ttl", inclusive=False)
        )
        object.__setattr__(
            self,
            "header_timeout",
            check_float(self.header_timeout, "header_timeout", param="header_timeout", inclusive=False),
        )
        object.__setattr__(
            self, "shutdown_grace", check_float(self.shutdown_grace, "shutdown_grace", param="shutdown_grace")
        )
        object.__setattr__(
            self,
            "keepalive_interval",
            check_float(self.keepalive_interval, "keepalive_interval", param="keepalive_interval", inclusive=False),
        )
        if self.session_strategy not in STRATEGIES:
            raise InvalidRequestError(
                f"session_strategy must be one of {', '.join(STRATEGIES)}, got {self.session_strategy!r}",
                param="session_strategy",
            )
        if self.compile is not None and not isinstance(self.compile, bool):
            raise InvalidRequestError(f"compile must be true, false or auto, got {self.compile!r}", param="compile")
        for name in ("metrics",):
            if not isinstance(getattr(self, name), bool):
                raise InvalidRequestError(f"{name} must be true or false, got {getattr(self, name)!r}", param=name)
        if self.log_level not in LOG_LEVELS:
            raise InvalidRequestError(
                f"log_level must be one of {', '.join(LOG_LEVELS)}, got {self.log_level!r}", param="log_level"
            )

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> ServerConfig:
        """A configuration from field names and values.

        Raises:
            InvalidRequestError: an unknown field (the message lists the valid ones) or a bad value.
        """
        _check_names(values)
        return cls(**values)

    @classmethod
    def from_env(cls, environ: Mapping[str, str], *, prefix: str = ENV_PREFIX) -> ServerConfig:
        """A configuration from ``SPECPREFILL_<FIELD>`` variables (e.g. ``SPECPREFILL_MAX_QUEUE=32``).

        Unset fields keep their defaults; ``SPECPREFILL_API_KEY`` holds comma-separated keys and
        booleans are ``1``/``true``/``yes`` or ``0``/``false``/``no``.

        Raises:
            InvalidRequestError: a value that does not read as its field's type, or a bad value.
        """
        for name, closest in misspelt_variables(environ, prefix=prefix):
            logger.warning("%s is not a setting: did you mean %s?", name, closest)
        return cls(**env_values(environ, prefix=prefix))

    @property
    def engine_options(self) -> dict[str, Any]:
        """`engine_args` as a dict (vLLM's keyword arguments)."""
        return dict(self.engine_args)

    @property
    def scoring_queued(self) -> bool:
        """Whether the draft's prompts are scored through a scoring queue (``scoring_queue`` resolved)."""
        if self.scoring_queue is not None:
            return self.scoring_queue
        return self.max_concurrency is not None and self.max_concurrency > 1

    @property
    def sessions_per_key(self) -> int:
        """``max_sessions_per_key`` resolved: the most conversations one API key may hold at once."""
        if self.max_sessions_per_key is not None:
            return min(self.max_sessions_per_key, self.max_sessions)
        return -(-self.max_sessions // max(1, len(self.api_keys)))

    def replace(self, **changes: Any) -> ServerConfig:
        """A copy with some settings changed (validated again)."""
        _check_names(changes)
        return dataclasses.replace(self, **changes)


_NO_KEY = "give a key, or unset the variable to serve without authentication"


def env_name(field: str, prefix: str = ENV_PREFIX) -> str:
    """The variable of a `ServerConfig` field: ``SPECPREFILL_MAX_QUEUE``; ``api_keys`` is ``SPECPREFILL_API_KEY``."""
    return prefix + ("API_KEY" if field == "api_keys" else field.upper())


def env_values(environ: Mapping[str, str], *, prefix: str = ENV_PREFIX) -> dict[str, Any]:
    """The `ServerConfig` fields that ``SPECPREFILL_<FIELD>`` variables set, read as their types (not yet checked).

    Raises:
        InvalidRequestError: a value that does not read as its field's type, naming the variable.
    """
    values: dict[str, Any] = {}
    for f in dataclasses.fields(ServerConfig):
        name = env_name(f.name, prefix)
        if name in environ:
            values[f.name] = _from_text(environ[name], str(f.type), name)
            if f.name == "api_keys" and not values[f.name]:
                raise InvalidRequestError(f"{name} is set but holds no key: {_NO_KEY}", param=name)
    return values


def misspelt_variables(environ: Mapping[str, str], *, prefix: str = ENV_PREFIX) -> list[tuple[str, str]]:
    """``(variable, closest valid name)`` for each unknown ``SPECPREFILL_*`` variable that looks like a typo.

    Valid names are the fields' variables and `OTHER_VARIABLES`. An unknown name close to none of
    them (a deployment's own variable) is left alone.
    """
    valid = [env_name(f.name, prefix) for f in dataclasses.fields(ServerConfig)]
    if prefix == ENV_PREFIX:
        valid += list(OTHER_VARIABLES)
    # Compared without the prefix, which every name shares and which would make any two look alike.
    rest = {name[len(prefix) :]: name for name in valid}
    out = []
    for name in sorted(environ):
        if name.startswith(prefix) and name not in valid:
            close = difflib.get_close_matches(name[len(prefix) :], list(rest), n=1, cutoff=0.75)
            if close:
                out.append((name, rest[close[0]]))
    return out


def is_loopback_host(host: str) -> bool:
    """Whether a bind address or host name is loopback: ``localhost``, 127.0.0.0/8 or ``::1``."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _engine_args(given: Any, engine: str) -> tuple[tuple[str, Any], ...]:
    """``given`` (a mapping or ``(name, value)`` pairs) as sorted pairs of JSON values, checked."""
    if isinstance(given, Mapping):
        pairs = list(given.items())
    elif isinstance(given, tuple | list) and all(isinstance(p, tuple | list) and len(p) == 2 for p in given):
        pairs = [tuple(p) for p in given]
    else:
        raise InvalidRequestError(
            f"engine_args must be a mapping of option names to values, got {given!r}", param="engine_args"
        )
    if pairs and engine != "vllm":
        raise InvalidRequestError(
            f"engine_args ({', '.join(str(k) for k, _ in pairs)}) are vLLM engine options: they need engine='vllm'",
            param="engine_args",
        )
    out: dict[str, Any] = {}
    for name, value in pairs:
        if not isinstance(name, str) or not name.isidentifier():
            raise InvalidRequestError(
                f"an engine option's name must be an identifier, got {name!r}", param="engine_args"
            )
        if name in _SERVER_OWNED:
            raise InvalidRequestError(
                f"engine option {name!r} is a server setting here: give {_SERVER_OWNED[name]} instead",
                param=f"engine_args.{name}",
            )
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            raise InvalidRequestError(
                f"engine option {name!r} must be a plain value (number, string, switch, list or mapping), "
                f"got {value!r}",
                param=f"engine_args.{name}",
            ) from None
        out[name] = value
    if "max_num_seqs" in out:
        check_int(out["max_num_seqs"], "max_num_seqs", param="engine_args.max_num_seqs", minimum=1)
    return tuple(sorted(out.items()))


#: vLLM options that the server sets from its own settings, so that each has one name.
_SERVER_OWNED = {"model": "model", "dtype": "dtype", "served_model_name": "served_model_name", "tokenizer": "model"}


def _check_names(values: Mapping[str, Any]) -> None:
    check_known(values, [f.name for f in dataclasses.fields(ServerConfig)], "server setting", "settings")


def _from_text(text: str, kind: str, name: str) -> Any:
    """``text`` read as a field of type ``kind`` (its annotation, as written above)."""
    text = text.strip()
    if kind.endswith("| None") and text.lower() in ("", "none", "auto"):
        return None
    base = kind.removesuffix(" | None")
    try:
        if base == "int":
            return int(text)
        if base == "float":
            return float(text)
    except ValueError:
        raise InvalidRequestError(f"{name} must be a number, got {text!r}", param=name) from None
    if base == "bool":
        if text.lower() in ("1", "true", "yes", "on"):
            return True
        if text.lower() in ("0", "false", "no", "off", ""):
            return False
        raise InvalidRequestError(f"{name} must be true or false, got {text!r}", param=name)
    if base.startswith("tuple[tuple"):  # engine_args: a JSON object
        try:
            value = json.loads(text or "{}")
        except ValueError as exc:
            raise InvalidRequestError(f"{name} must be a JSON object, got {text!r}: {exc}", param=name) from None
        if not isinstance(value, dict):
            raise InvalidRequestError(f"{name} must be a JSON object, got {text!r}", param=name)
        return value
    if base.startswith("tuple"):
        return tuple(k.strip() for k in text.split(",") if k.strip())
    return text


def _check_text(value: object, name: str) -> None:
    if not isinstance(value, str) or not value:
        raise InvalidRequestError(f"{name} must be a non-empty string, got {value!r}", param=name)
