"""``specprefill serve``: run the OpenAI-compatible server with uvicorn.

Example::

    specprefill serve --model smollm2-135m --policy paper --port 8000 --api-key "$KEY"
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
from collections.abc import Mapping
from typing import Any

from ..errors import InvalidRequestError
from ..server import DEFAULT_WARMUP_TOKENS
from ..server.config import (
    ENGINES,
    LOG_LEVELS,
    STRATEGIES,
    ServerConfig,
    env_name,
    env_values,
    is_loopback_host,
    misspelt_variables,
)
from ._args import add_model_options, non_negative_int, non_negative_number, positive_int, positive_number

__all__ = [
    "API_KEY_ENV",
    "LOG_FORMAT",
    "OTEL_ENV",
    "VLLM_OPTIONS",
    "add_arguments",
    "api_keys",
    "config_from_args",
    "engine_args",
    "main",
    "otel_kind",
    "uvicorn_log_config",
]

logger = logging.getLogger(__name__)

#: The defaults of every option, written once in `ServerConfig`.
_D = ServerConfig()
#: Environment variable read when ``--api-key`` is not given.
API_KEY_ENV = "SPECPREFILL_API_KEY"
#: Environment variable read when ``--otel`` is not given (not a `ServerConfig` field: it builds providers).
OTEL_ENV = "SPECPREFILL_OTEL"
OTEL_KINDS = ("none", "console", "otlp")
#: The format of every log line of the server, uvicorn's included.
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def api_keys(given: list[str] | None, env: str | None) -> list[str]:
    """The server's API keys: the ``--api-key`` values, else the comma-separated environment variable.

    Raises:
        InvalidRequestError: an empty ``--api-key`` (``--api-key "$KEY"`` with KEY unset), or a
            variable that is set but holds no key: either would otherwise serve without authentication.
    """
    if given is not None:
        if any(not k.strip() for k in given):
            raise InvalidRequestError(
                "--api-key is empty (an unset variable?): give a non-empty key, or leave --api-key out "
                "to serve without authentication",
                param="api_keys",
            )
        return list(given)
    if env is None:
        return []
    keys = [k.strip() for k in env.split(",") if k.strip()]
    if not keys:
        raise InvalidRequestError(
            f"{API_KEY_ENV} is set but holds no key: give a key, or unset it to serve without authentication",
            param="api_keys",
        )
    return keys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``serve`` options to ``parser``.

    Every option defaults to None ("not given"): `config_from_args` fills what the command line
    leaves out from ``SPECPREFILL_*`` variables, then from `ServerConfig`'s defaults, which the help
    texts show with the variable of each option.
    """
    first = len(parser._actions)
    add_model_options(
        parser,
        compile_help="fuse the draft's and the target's element-wise work with torch.compile (default: on for a "
        "CUDA device, off elsewhere; it compiles at start, tens of seconds; --no-compile turns it off)",
    )
    parser.add_argument("--policy", help=f"default policy preset (default: {_D.policy})")
    parser.add_argument("--host", help=f"address to bind (default: {_D.host})")
    parser.add_argument("--port", type=non_negative_int, help=f"port to bind (default: {_D.port})")
    parser.add_argument(
        "--api-key",
        action="append",
        default=None,
        help="require 'Authorization: Bearer KEY' on /v1 routes; repeat for several keys, each with its own "
        "conversations (default: none; the variable holds comma-separated keys)",
    )
    parser.add_argument(
        "--max-prompt-tokens",
        type=positive_int,
        default=None,
        help="refuse longer prompts with 413 (default: the model's context)",
    )
    parser.add_argument(
        "--max-output-tokens",
        type=positive_int,
        default=None,
        help="refuse requests asking for more generated tokens with 400 (default: no limit but the context)",
    )
    parser.add_argument(
        "--max-concurrency",
        type=positive_int,
        default=None,
        help="requests doing model work at once (default: 1 with --engine transformers; with --engine vllm, "
        "--max-num-seqs or 256)",
    )
    parser.add_argument(
        "--max-queue",
        type=non_negative_int,
        help=f"requests allowed to wait; more get 429 (default: {_D.max_queue})",
    )
    parser.add_argument(
        "--max-body-bytes",
        type=positive_int,
        default=None,
        help="refuse larger request bodies with 413 (default: 4 MiB)",
    )
    parser.add_argument(
        "--header-timeout",
        type=positive_number,
        help="seconds a connection may take to send a request's head (request line and headers); then it is "
        f"closed, with 408 if part of one came (default: {_D.header_timeout:g})",
    )
    parser.add_argument(
        "--max-connections",
        type=positive_int,
        help="HTTP connections served at once; a connection beyond them gets 503 with Retry-After "
        f"(default: {_D.max_connections})",
    )
    parser.add_argument(
        "--shutdown-grace",
        type=non_negative_number,
        help="seconds running requests get to finish at shutdown (SIGTERM); queued and new ones get 503 at once, "
        f"streams still running after it end with an error event and [DONE] (default: {_D.shutdown_grace:g})",
    )
    parser.add_argument(
        "--session-ttl",
        type=positive_number,
        help=f"seconds a conversation kept on the server may stay idle before it expires (default: {_D.session_ttl:g})",
    )
    parser.add_argument(
        "--keepalive-interval",
        type=positive_number,
        help="seconds a stream may send nothing (scoring a long prompt) before an SSE keep-alive comment "
        f"(default: {_D.keepalive_interval:g})",
    )
    parser.add_argument(
        "--max-sessions",
        type=non_negative_int,
        help="conversations kept on the server at once; a new one evicts the least recently used idle one; "
        f"0 serves none (default: {_D.max_sessions})",
    )
    parser.add_argument(
        "--max-sessions-per-key",
        type=positive_int,
        help="conversations one API key may hold at once; its start beyond that evicts its own least recently "
        "used idle one (default: --max-sessions shared out evenly among the API keys)",
    )
    parser.add_argument(
        "--session-strategy",
        choices=STRATEGIES,
        help="strategy of a conversation whose first request names none: recompute, incremental or refresh "
        f"(default: {_D.session_strategy})",
    )
    parser.add_argument("--served-model-name", default=None, help="model id clients send (default: --model)")
    parser.add_argument(
        "--warmup-tokens",
        type=non_negative_int,
        default=None,
        help="before accepting requests, serve one prompt of this many tokens and prefill it whole, so that "
        f"compiling happens at start; 0: none (default: {DEFAULT_WARMUP_TOKENS} when compiling on a GPU, else 0)",
    )
    parser.add_argument(
        "--metrics",
        action="store_true",
        help="serve Prometheus metrics at GET /metrics (with --api-key it needs a key too; default: off)",
    )
    parser.add_argument(
        "--scoring-queue",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="score concurrent requests' prompts through one queue, in arrival order, batched with "
        "--scoring-batch-tokens (default: on with --max-concurrency above 1)",
    )
    parser.add_argument(
        "--scoring-batch-tokens",
        type=positive_int,
        default=None,
        help="the most prompt tokens one scoring batch holds, e.g. 16384 (default: every prompt scored alone, so "
        "that its selection does not depend on the load)",
    )
    parser.add_argument(
        "--scoring-wait-ms",
        type=non_negative_number,
        help="with --scoring-batch-tokens: how long a scoring batch waits for more prompts while other requests "
        "run; a request alone never "
        f"waits (default: {_D.scoring_wait_ms:g})",
    )
    parser.add_argument("--otel", choices=OTEL_KINDS, help="export traces and metrics (default: none)")
    parser.add_argument(
        "--log-level",
        choices=LOG_LEVELS,
        help="server log level (default: info)",
    )
    parser.add_argument(
        "--engine",
        choices=ENGINES,
        help="where the target runs: transformers (this process) or vllm (vLLM's engine: continuous batching, "
        "chunked prefill, prefix caching, CUDA graphs; needs the vllm extra and a GPU) (default: transformers)",
    )
    vllm = parser.add_argument_group(
        "vLLM engine (with --engine vllm; the names and meanings of `vllm serve`'s options)",
    )
    for flag, kind, text in VLLM_OPTIONS:
        if kind is bool:
            vllm.add_argument(flag, action="store_true", default=None, help=text)
        else:
            vllm.add_argument(flag, type=kind, default=None, help=text)
    vllm.add_argument(
        "--engine-arg",
        action="append",
        default=None,
        metavar="NAME=VALUE",
        help="any other vLLM engine option (vllm.EngineArgs name; VALUE read as JSON, else as text), e.g. "
        "--engine-arg swap_space=8; repeatable",
    )
    parser.set_defaults(
        model=None, device=None, dtype=None, compile=None, metrics=None
    )  # not given: environment, then config
    for action in parser._actions[first:]:
        variable = _variable(action.dest)
        if variable and action.help:
            action.help += f" [env: {variable}]"


def _variable(dest: str) -> str | None:
    """The environment variable behind the option stored in ``dest`` (vLLM's: keys of one JSON object)."""
    if dest == "otel":
        return OTEL_ENV
    if dest == "api_key":
        return API_KEY_ENV
    if dest in _FIELDS:
        return env_name(dest)
    if dest == "engine_arg" or dest in _VLLM_DESTS:
        key = "" if dest == "engine_arg" else f" key {_vllm_name(dest)}"
        return env_name("engine_args") + key
    return None


def _fraction(text: str) -> float:
    value = positive_number(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}")
    return value


def _engine_core(text: str) -> str:
    # `VLLMBackend`'s choices, checked here so that a typo fails before vLLM starts.
    from ..backends.vllm.parallel import ENGINE_CORES

    if text not in ENGINE_CORES:
        raise argparse.ArgumentTypeError(f"must be one of {', '.join(ENGINE_CORES)}, got {text}")
    return text


#: The vLLM engine options ``serve`` names, as ``vllm serve`` spells them: (flag, type, help).
VLLM_OPTIONS: tuple[tuple[str, Any, str], ...] = (
    ("--tensor-parallel-size", positive_int, "GPUs the target is split over (vLLM's; default 1)"),
    ("--max-model-len", positive_int, "context length of the engine (default: the model's)"),
    (
        "--gpu-memory-utilization",
        _fraction,
        "vLLM's share of each GPU's memory (default: planned to leave --draft-memory-gib free for the draft)",
    ),
    ("--max-num-seqs", positive_int, "requests vLLM runs at once (vLLM's default)"),
    ("--max-num-batched-tokens", positive_int, "tokens per engine step, the chunked-prefill size (vLLM's default)"),
    ("--enforce-eager", bool, "no CUDA graphs or torch.compile in the target (faster start, slower steps)"),
    ("--load-format", str, "vLLM's weight format: auto, safetensors, ... or dummy (random weights, for benchmarks)"),
    ("--no-enable-prefix-caching", bool, "turn vLLM's prefix caching off (compressed requests are salted by layout)"),
    ("--seed", non_negative_int, "vLLM's random seed, for sampled requests without their own seed (default 0)"),
    ("--draft-device", str, "where the draft scores: auto (a spare GPU, else beside rank 0), cuda:N (default: auto)"),
    ("--draft-memory-gib", positive_number, "GPU memory left to the draft beside rank 0 (default: 8)"),
    (
        "--engine-core",
        _engine_core,
        "where vLLM's scheduler and model runner run: auto (this process, beside the draft, with one rank "
        "sharing the draft's GPU; else vLLM's own process), in-process or subprocess (default: auto)",
    ),
)


_FIELDS = frozenset(f.name for f in dataclasses.fields(ServerConfig)) - {"api_keys", "engine_args"}
_VLLM_DESTS = tuple(flag.lstrip("-").replace("-", "_") for flag, _kind, _text in VLLM_OPTIONS)


def _vllm_name(dest: str) -> str:
    return "enable_prefix_caching" if dest == "no_enable_prefix_caching" else dest


def engine_args(args: argparse.Namespace, engine: str | None = None) -> dict[str, Any]:
    """The vLLM engine options among ``args`` (named options and ``--engine-arg`` pairs).

    ``engine`` is the engine in effect (default: ``args.engine``, else the configuration's default).

    Raises:
        InvalidRequestError: an option without ``--engine vllm``, or a malformed ``--engine-arg``.
    """
    values: dict[str, Any] = {}
    for dest in _VLLM_DESTS:
        value = getattr(args, dest, None)
        if value is None:
            continue
        if dest == "no_enable_prefix_caching":
            value = False
        values[_vllm_name(dest)] = value
    for item in getattr(args, "engine_arg", None) or []:
        name, sep, text = item.partition("=")
        name = name.strip().replace("-", "_")
        if not sep or not name:
            raise InvalidRequestError(f"--engine-arg takes NAME=VALUE, got {item!r}", param="engine_args")
        if name in values:
            raise InvalidRequestError(f"vLLM option {name!r} is given twice", param=f"engine_args.{name}")
        try:
            values[name] = json.loads(text)
        except ValueError:
            values[name] = text
    engine = engine or getattr(args, "engine", None) or _D.engine
    if values and engine != "vllm":
        names = ", ".join("--" + k.replace("_", "-") for k in values)
        raise InvalidRequestError(f"{names}: vLLM engine options, which need --engine vllm", param="engine")
    return values


def _configure_telemetry(kind: str) -> tuple[Any, Any]:
    """Exporting tracer and meter providers for ``--otel`` (None, None for ``none``).

    Raises:
        SpecPrefillError: the ``otel`` extra is not installed.
    """
    if kind == "none":
        return None, None
    from ..tracing.setup import configure

    return configure(kind, set_global=True, service_name="specprefill-server")


def config_from_args(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> ServerConfig:
    """The `ServerConfig` that ``serve``'s options describe, the rest from ``SPECPREFILL_*`` variables.

    The command line wins over the environment, the environment over `ServerConfig`'s defaults;
    vLLM engine options merge key by key (``SPECPREFILL_ENGINE_ARGS`` under the command line's).

    Raises:
        InvalidRequestError: a value the configuration refuses (naming the variable when it came
            from the environment).
    """
    environ = os.environ if environ is None else environ
    from_env = env_values({k: v for k, v in environ.items() if k != API_KEY_ENV})
    given = {name: getattr(args, name) for name in _FIELDS if getattr(args, name, None) is not None}
    values = {**from_env, **given}
    values["api_keys"] = tuple(api_keys(args.api_key, environ.get(API_KEY_ENV)))
    engine = values.get("engine", _D.engine)
    values["engine_args"] = {**dict(from_env.get("engine_args", {})), **engine_args(args, engine)}
    try:
        return ServerConfig(**values)
    except InvalidRequestError as exc:
        field = (exc.param or "").split(".", 1)[0]
        if field in from_env and field not in given:
            variable = env_name(field)
            raise InvalidRequestError(f"{variable}: {exc.message}", param=variable) from None
        raise


def otel_kind(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> str:
    """``--otel``, else ``SPECPREFILL_OTEL``, else ``none``.

    Raises:
        InvalidRequestError: the variable names no exporter.
    """
    environ = os.environ if environ is None else environ
    if args.otel is not None:
        return str(args.otel)
    kind = environ.get(OTEL_ENV, "none").strip().lower() or "none"
    if kind not in OTEL_KINDS:
        raise InvalidRequestError(f"{OTEL_ENV} must be one of {', '.join(OTEL_KINDS)}, got {kind!r}", param=OTEL_ENV)
    return kind


def uvicorn_log_config(level: str) -> dict[str, Any]:
    """uvicorn's logging configuration with the server's `LOG_FORMAT`, so that every line reads alike.

    uvicorn installs its own formatters (``INFO:     127.0.0.1:5000 - "POST ..."``) unless given
    one; its access lines keep their content (client, request line, status) in this format.
    """
    formatter = {"()": "logging.Formatter", "fmt": LOG_FORMAT}
    handler = {"class": "logging.StreamHandler", "formatter": "default", "stream": "ext://sys.stderr"}
    upper = level.upper()
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"default": formatter},
        "handlers": {"default": handler},
        "loggers": {
            "uvicorn": {"handlers": ["default"], "level": upper, "propagate": False},
            "uvicorn.error": {"level": upper},
            "uvicorn.access": {"handlers": ["default"], "level": upper, "propagate": False},
        },
    }


def main(args: argparse.Namespace) -> int:
    """Load the models, build the app and serve until interrupted; returns the exit status."""
    from ..server.app import create_app
    from ..server.listener import serve

    config = config_from_args(args)
    logging.basicConfig(level=config.log_level.upper(), format=LOG_FORMAT)
    for name, closest in misspelt_variables(os.environ):
        logger.warning("%s is not a setting: did you mean %s?", name, closest)
    tracer_provider, meter_provider = _configure_telemetry(otel_kind(args))
    if not config.api_keys and not is_loopback_host(config.host):
        logger.warning("serving on %s without an API key: anyone who reaches this address can use it", config.host)
    app = create_app(config, tracer_provider=tracer_provider, meter_provider=meter_provider)
    serve(app, config, log_config=uvicorn_log_config(config.log_level))
    return 0
