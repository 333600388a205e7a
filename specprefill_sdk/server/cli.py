"""``specprefill serve``: run the OpenAI-compatible server with uvicorn.

Example::

    specprefill serve --model smollm2-135m --policy paper --port 8000 --api-key "$KEY"
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
from typing import Any

from . import DEFAULT_MAX_SESSIONS, DEFAULT_SESSION_STRATEGY, DEFAULT_SESSION_TTL, DEFAULT_WARMUP_TOKENS

__all__ = ["API_KEY_ENV", "add_arguments", "api_keys", "main"]

logger = logging.getLogger(__name__)

#: Environment variable read when ``--api-key`` is not given.
API_KEY_ENV = "SPECPREFILL_API_KEY"


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from exc
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be >= 1")
    return value


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from exc
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} must be >= 0")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from exc
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{value} must be a finite number > 0")
    return value


def api_keys(given: list[str] | None, env: str | None) -> list[str]:
    """The server's API keys: the ``--api-key`` values, else the comma-separated environment variable."""
    if given:
        return [k for k in given if k]
    return [k.strip() for k in (env or "").split(",") if k.strip()]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``serve`` options to ``parser``."""
    parser.add_argument("--model", default="smollm2-135m", help="target model spec (default: smollm2-135m)")
    parser.add_argument("--draft", default=None, help="draft model spec (default: the target itself)")
    parser.add_argument("--policy", default="paper", help="default policy preset (default: paper)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    parser.add_argument("--port", type=_non_negative, default=8000, help="port to bind (default: 8000)")
    parser.add_argument(
        "--api-key",
        action="append",
        default=None,
        help="require 'Authorization: Bearer KEY' on /v1 routes; repeat for several keys, each with its own "
        f"conversations (default: ${API_KEY_ENV}, comma-separated)",
    )
    parser.add_argument(
        "--max-prompt-tokens",
        type=_positive,
        default=None,
        help="refuse longer prompts with 413 (default: the model's context)",
    )
    parser.add_argument(
        "--max-output-tokens",
        type=_positive,
        default=None,
        help="refuse requests asking for more generated tokens with 400 (default: no limit but the context)",
    )
    parser.add_argument(
        "--max-concurrency", type=_positive, default=1, help="requests doing model work at once (default: 1)"
    )
    parser.add_argument(
        "--max-queue", type=_non_negative, default=16, help="requests allowed to wait; more get 429 (default: 16)"
    )
    parser.add_argument(
        "--max-body-bytes", type=_positive, default=None, help="refuse larger request bodies with 413 (default: 4 MiB)"
    )
    parser.add_argument(
        "--session-ttl",
        type=_positive_float,
        default=DEFAULT_SESSION_TTL,
        help="seconds a conversation kept on the server may stay idle before it expires "
        f"(default: {DEFAULT_SESSION_TTL:g})",
    )
    parser.add_argument(
        "--max-sessions",
        type=_non_negative,
        default=DEFAULT_MAX_SESSIONS,
        help="conversations kept on the server at once; a new one evicts the least recently used idle one; "
        f"0 serves none (default: {DEFAULT_MAX_SESSIONS})",
    )
    parser.add_argument(
        "--session-strategy",
        default=DEFAULT_SESSION_STRATEGY,
        help="strategy of a conversation whose first request names none: recompute, incremental or refresh "
        f"(default: {DEFAULT_SESSION_STRATEGY})",
    )
    parser.add_argument("--served-model-name", default=None, help="model id clients send (default: --model)")
    parser.add_argument("--device", default="auto", help="cpu, cuda, cuda:1 ... (default: auto)")
    parser.add_argument("--dtype", default="auto", help="bfloat16, float16, float32 (default: auto)")
    parser.add_argument(
        "--compile",
        action="store_true",
        help="fuse the draft's and the target's element-wise work with torch.compile (CUDA only; the first "
        "long prompts compile, tens of seconds: see --warmup-tokens)",
    )
    parser.add_argument(
        "--warmup-tokens",
        type=_non_negative,
        default=None,
        help="before accepting requests, serve one prompt of this many tokens and prefill it whole, so that "
        f"compiling happens at start; 0: none (default: {DEFAULT_WARMUP_TOKENS} with --compile on a GPU, else 0)",
    )
    parser.add_argument(
        "--otel", choices=("none", "console", "otlp"), default="none", help="export traces and metrics (default: none)"
    )
    parser.add_argument(
        "--log-level",
        default="info",
        choices=("critical", "error", "warning", "info", "debug"),
        help="server log level (default: info)",
    )


def _configure_telemetry(kind: str) -> tuple[Any, Any]:
    """Exporting tracer and meter providers for ``--otel`` (None, None when unavailable or ``none``)."""
    if kind == "none":
        return None, None
    try:
        setup = importlib.import_module("specprefill_sdk.telemetry_setup")
    except ImportError:
        logger.warning("--otel %s asked for, but telemetry set-up is not available in this installation", kind)
        return None, None
    configure = getattr(setup, "configure", None)
    if configure is None:
        logger.warning("--otel %s asked for, but telemetry set-up has no configure()", kind)
        return None, None
    try:
        providers = configure(kind, set_global=True, service_name="specprefill-server")
    except TypeError:
        providers = configure(kind)
    if isinstance(providers, tuple) and len(providers) == 2:
        return providers[0], providers[1]
    return None, None


def main(args: argparse.Namespace) -> int:
    """Load the models, build the app and serve until interrupted; returns the exit status."""
    import uvicorn

    from ..conversation import STRATEGIES
    from .app import DEFAULT_MAX_BODY_BYTES, create_app

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.session_strategy not in STRATEGIES:
        logger.error("--session-strategy must be one of %s, not %r", ", ".join(STRATEGIES), args.session_strategy)
        return 2
    tracer_provider, meter_provider = _configure_telemetry(args.otel)
    keys = api_keys(args.api_key, os.environ.get(API_KEY_ENV))
    if not keys and args.host not in ("127.0.0.1", "localhost", "::1"):
        logger.warning("serving on %s without an API key: anyone who reaches this address can use it", args.host)
    app = create_app(
        args.model,
        draft=args.draft,
        policy=args.policy,
        api_key=keys or None,
        max_prompt_tokens=args.max_prompt_tokens,
        max_output_tokens=args.max_output_tokens,
        max_concurrency=args.max_concurrency,
        max_queue=args.max_queue,
        max_body_bytes=args.max_body_bytes or DEFAULT_MAX_BODY_BYTES,
        served_model_name=args.served_model_name,
        device=args.device,
        dtype=args.dtype,
        tracer_provider=tracer_provider,
        meter_provider=meter_provider,
        session_ttl=args.session_ttl,
        max_sessions=args.max_sessions,
        default_strategy=args.session_strategy,
        compile=args.compile,
        warmup_tokens=args.warmup_tokens,
    )
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, timeout_graceful_shutdown=5)
    return 0
