"""``specprefill serve``: run the OpenAI-compatible server with uvicorn.

Example::

    specprefill serve --model smollm2-135m --policy paper --port 8000 --api-key "$KEY"
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from collections.abc import Mapping
from typing import Any

from ..errors import InvalidRequestError
from ..server import DEFAULT_WARMUP_TOKENS
from ..server.config import (
    DEFAULT_MAX_BODY_BYTES,
    ENGINES,
    LOG_LEVELS,
    STRATEGIES,
    ServerConfig,
    is_loopback_host,
)
from ._args import add_model_options, non_negative_int, non_negative_number, positive_int, positive_number

__all__ = ["API_KEY_ENV", "VLLM_OPTIONS", "add_arguments", "api_keys", "config_from_args", "engine_args", "main"]

logger = logging.getLogger(__name__)

#: The defaults of every option, written once in `ServerConfig`.
_D = ServerConfig()
#: Environment variable read when ``--api-key`` is not given.
API_KEY_ENV = "SPECPREFILL_API_KEY"


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
    """Add the ``serve`` options to ``parser``."""
    add_model_options(
        parser,
        compile_help="fuse the draft's and the target's element-wise work with torch.compile (CUDA only; the "
        "first long prompts compile, tens of seconds: see --warmup-tokens)",
    )
    parser.add_argument("--policy", default=_D.policy, help=f"default policy preset (default: {_D.policy})")
    parser.add_argument("--host", default=_D.host, help=f"address to bind (default: {_D.host})")
    parser.add_argument("--port", type=non_negative_int, default=_D.port, help=f"port to bind (default: {_D.port})")
    parser.add_argument(
        "--api-key",
        action="append",
        default=None,
        help="require 'Authorization: Bearer KEY' on /v1 routes; repeat for several keys, each with its own "
        f"conversations (default: ${API_KEY_ENV}, comma-separated)",
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
        default=_D.max_queue,
        help=f"requests allowed to wait; more get 429 (default: {_D.max_queue})",
    )
    parser.add_argument(
        "--max-body-bytes",
        type=positive_int,
        default=None,
        help="refuse larger request bodies with 413 (default: 4 MiB)",
    )
    parser.add_argument(
        "--session-ttl",
        type=positive_number,
        default=_D.session_ttl,
        help=f"seconds a conversation kept on the server may stay idle before it expires (default: {_D.session_ttl:g})",
    )
    parser.add_argument(
        "--keepalive-interval",
        type=positive_number,
        default=_D.keepalive_interval,
        help="seconds a stream may send nothing (scoring a long prompt) before an SSE keep-alive comment "
        f"(default: {_D.keepalive_interval:g})",
    )
    parser.add_argument(
        "--max-sessions",
        type=non_negative_int,
        default=_D.max_sessions,
        help="conversations kept on the server at once; a new one evicts the least recently used idle one; "
        f"0 serves none (default: {_D.max_sessions})",
    )
    parser.add_argument(
        "--session-strategy",
        default=_D.session_strategy,
        help="strategy of a conversation whose first request names none: recompute, incremental or refresh "
        f"(default: {_D.session_strategy})",
    )
    parser.add_argument("--served-model-name", default=None, help="model id clients send (default: --model)")
    parser.add_argument(
        "--warmup-tokens",
        type=non_negative_int,
        default=None,
        help="before accepting requests, serve one prompt of this many tokens and prefill it whole, so that "
        f"compiling happens at start; 0: none (default: {DEFAULT_WARMUP_TOKENS} with --compile on a GPU, else 0)",
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
        help="score concurrent requests' prompts together in batches (default: on with --max-concurrency above 1)",
    )
    parser.add_argument(
        "--scoring-batch-tokens",
        type=positive_int,
        default=None,
        help="the most prompt tokens one scoring batch holds (default: the draft's max_batch_tokens, 16384)",
    )
    parser.add_argument(
        "--scoring-wait-ms",
        type=non_negative_number,
        default=_D.scoring_wait_ms,
        help="how long a scoring batch waits for more prompts while other requests run; a request alone never "
        f"waits (default: {_D.scoring_wait_ms:g})",
    )
    parser.add_argument(
        "--otel", choices=("none", "console", "otlp"), default="none", help="export traces and metrics (default: none)"
    )
    parser.add_argument(
        "--log-level",
        default=_D.log_level,
        choices=LOG_LEVELS,
        help="server log level (default: info)",
    )
    parser.add_argument(
        "--engine",
        choices=ENGINES,
        default=_D.engine,
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


def _fraction(text: str) -> float:
    value = positive_number(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}")
    return value


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
)


def engine_args(args: argparse.Namespace) -> dict[str, Any]:
    """The vLLM engine options among ``args`` (named options and ``--engine-arg`` pairs).

    Raises:
        InvalidRequestError: an option without ``--engine vllm``, or a malformed ``--engine-arg``.
    """
    values: dict[str, Any] = {}
    for flag, _kind, _text in VLLM_OPTIONS:
        dest = flag.lstrip("-").replace("-", "_")
        value = getattr(args, dest, None)
        if value is None:
            continue
        if dest == "no_enable_prefix_caching":
            dest, value = "enable_prefix_caching", False
        values[dest] = value
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
    if values and args.engine != "vllm":
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
    """The `ServerConfig` that ``serve``'s options describe (API keys from ``environ`` when none is given).

    Raises:
        InvalidRequestError: a value the configuration refuses.
    """
    environ = os.environ if environ is None else environ
    return ServerConfig(
        model=args.model,
        draft=args.draft,
        policy=args.policy,
        api_keys=tuple(api_keys(args.api_key, environ.get(API_KEY_ENV))),
        max_prompt_tokens=args.max_prompt_tokens,
        max_output_tokens=args.max_output_tokens,
        max_concurrency=args.max_concurrency,
        max_queue=args.max_queue,
        max_body_bytes=args.max_body_bytes or DEFAULT_MAX_BODY_BYTES,
        served_model_name=args.served_model_name,
        device=args.device,
        dtype=args.dtype,
        keepalive_interval=args.keepalive_interval,
        session_ttl=args.session_ttl,
        max_sessions=args.max_sessions,
        session_strategy=args.session_strategy,
        compile=args.compile,
        warmup_tokens=args.warmup_tokens,
        metrics=args.metrics,
        scoring_queue=args.scoring_queue,
        scoring_batch_tokens=args.scoring_batch_tokens,
        scoring_wait_ms=args.scoring_wait_ms,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        engine=args.engine,
        engine_args=tuple(sorted(engine_args(args).items())),
    )


def main(args: argparse.Namespace) -> int:
    """Load the models, build the app and serve until interrupted; returns the exit status."""
    import uvicorn

    from ..server.app import create_app

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.session_strategy not in STRATEGIES:
        logger.error("--session-strategy must be one of %s, not %r", ", ".join(STRATEGIES), args.session_strategy)
        return 2
    config = config_from_args(args)
    tracer_provider, meter_provider = _configure_telemetry(args.otel)
    if not config.api_keys and not is_loopback_host(config.host):
        logger.warning("serving on %s without an API key: anyone who reaches this address can use it", config.host)
    app = create_app(config, tracer_provider=tracer_provider, meter_provider=meter_provider)
    uvicorn.run(app, host=config.host, port=config.port, log_level=config.log_level, timeout_graceful_shutdown=5)
    return 0
