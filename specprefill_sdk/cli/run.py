"""``specprefill run``: answer one prompt with speculative prefill and report what it kept and how fast.

The answer streams to stdout and a small table of statistics follows on stderr, so redirecting
stdout captures the answer alone. With ``--json`` stdout holds exactly one JSON object and nothing
else; logs and progress bars always go to stderr.

Plain-text prompts are wrapped in the model's chat template as one user message when the model has
one (instruct models answer far better that way); ``--no-chat-template`` sends the text as it is.

Example::

    specprefill run --prompt-file essay.txt --keep 0.1 --max-tokens 64
    specprefill run --messages-file chat.json --policy conservative --json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import InvalidRequestError
from ._args import add_model_options, keep_rate, non_negative_number, positive_int

if TYPE_CHECKING:
    from ..pipeline import Pipeline
    from ..types import Completion, Message, Prompt

__all__ = ["add_arguments", "main"]

logger = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``run`` options to ``parser``."""
    models = parser.add_argument_group("models")
    add_model_options(
        models,
        compile_help="fuse element-wise work with torch.compile (default: on for a CUDA device, off elsewhere; "
        "compiling happens at load, tens of seconds once per process: --no-compile for a one-off run)",
    )

    policy = parser.add_argument_group("compression").add_mutually_exclusive_group()
    policy.add_argument(
        "--keep",
        type=keep_rate,
        metavar="RATE",
        help="keep this share of the prompt, in (0, 1] (the paper policy at this rate)",
    )
    policy.add_argument("--policy", default=None, metavar="NAME", help="policy preset or .toml file (default: auto)")

    prompt = parser.add_argument_group("prompt (one of)").add_mutually_exclusive_group()
    prompt.add_argument("--prompt", metavar="TEXT", help="the prompt text")
    prompt.add_argument("--prompt-file", metavar="FILE", help="read the prompt text from FILE ('-': stdin)")
    prompt.add_argument(
        "--messages-file", metavar="FILE", help="read chat messages from FILE: a JSON list of {role, content}"
    )
    parser.add_argument(
        "--chat-template",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="wrap a text prompt in the model's chat template as a user message (default: when it has one)",
    )

    sampling = parser.add_argument_group("generation")
    sampling.add_argument("--max-tokens", type=positive_int, default=256, help="tokens to generate (default: 256)")
    sampling.add_argument("--temperature", type=non_negative_number, default=0.0, help="0 is greedy (default: 0)")
    sampling.add_argument("--seed", type=int, default=None, help="seed for sampling")
    parser.add_argument("--json", action="store_true", help="print one JSON object with the answer and statistics")
    parser.add_argument(
        "--otel",
        choices=("none", "console", "otlp"),
        default="none",
        help="export traces and metrics: console (JSON on stderr) or otlp (configured by the OTEL_* "
        "variables); needs specprefill-sdk[otel] (default: none)",
    )


def _read_file(name: str, what: str) -> str:
    try:
        data = sys.stdin.buffer.read() if name == "-" else Path(name).expanduser().read_bytes()
    except FileNotFoundError:
        raise InvalidRequestError(f"{what} not found: {name}", param=what.replace(" ", "_")) from None
    except IsADirectoryError:
        raise InvalidRequestError(f"{what} {name} is a folder, not a file", param=what.replace(" ", "_")) from None
    except OSError as exc:
        raise InvalidRequestError(f"cannot read {what} {name}: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InvalidRequestError(
            f"{what} {name} is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})"
        ) from None


def _messages(name: str) -> tuple[Message, ...]:
    text = _read_file(name, "messages file")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidRequestError(
            f"messages file {name} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    if isinstance(data, dict) and "messages" in data:  # an OpenAI request body works too
        data = data["messages"]
    if not isinstance(data, list):
        raise InvalidRequestError(
            f'messages file {name} must hold a JSON list of {{"role", "content"}} objects', param="messages"
        )
    from ..prompt import normalize_messages

    messages = normalize_messages(data)
    if not any(m.content.strip() for m in messages):
        raise InvalidRequestError("every message in the messages file is empty", param="messages")
    return messages


def _prompt_input(args: argparse.Namespace) -> str | tuple[Message, ...]:
    """The prompt text or messages, validated before any model is loaded."""
    if args.messages_file is not None:
        return _messages(args.messages_file)
    if args.prompt_file is not None:
        text = _read_file(args.prompt_file, "prompt file")
    elif args.prompt is not None:
        text = args.prompt
    else:
        raise InvalidRequestError("no prompt given: use --prompt TEXT, --prompt-file FILE or --messages-file FILE")
    if not text.strip():
        raise InvalidRequestError("the prompt is empty", param="prompt")
    return text


def _build_prompt(pipe: Pipeline, given: str | tuple[Message, ...], chat_template: bool | None) -> Prompt:
    from ..prompt import build_prompt

    tokenizer = pipe.backend.tokenizer
    if isinstance(given, str):
        has_template = getattr(tokenizer, "chat_template", None) is not None
        if chat_template and not has_template:
            raise InvalidRequestError("--chat-template: this model's tokenizer has no chat template")
        wrap = has_template if chat_template is None else chat_template
        return build_prompt(tokenizer, given, chat_template=wrap)
    return build_prompt(tokenizer, list(given))


def _configure_logging(verbose: int) -> None:
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    if verbose == 0:
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def _json_result(completion: Completion, pipe: Pipeline, policy: str) -> dict[str, Any]:
    selection = completion.selection
    return {
        "text": completion.text,
        "finish_reason": completion.finish_reason,
        "prompt_tokens": completion.usage.prompt_tokens,
        "kept_tokens": completion.usage.kept_tokens,
        "completion_tokens": completion.usage.completion_tokens,
        "keep_ratio": completion.usage.keep_ratio,
        "timings_ms": completion.timings.as_dict(),
        "model": completion.model or pipe.backend.model_name,
        "draft": pipe.draft_name,
        "policy": policy,
        "selector": pipe.selector.name,
        "reason": selection.reason if selection is not None else None,
        "fallback": completion.fallback,
        # seconds `Pipeline.warmup` took at load (compiling, measuring costs); None: it did not run
        "warmup_s": None if pipe.warmed_up is None else round(pipe.warmed_up.seconds, 3),
    }


def _stats_table(completion: Completion, pipe: Pipeline, policy: str) -> Any:
    from rich.table import Table

    usage, t = completion.usage, completion.timings
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="dim")
    table.add_column()
    table.add_row("prompt tokens", str(usage.prompt_tokens))
    table.add_row("kept tokens", f"{usage.kept_tokens} ({usage.keep_ratio:.1%})")
    table.add_row("generated tokens", f"{usage.completion_tokens} ({completion.finish_reason})")
    table.add_row("policy", f"{policy}: {pipe.selector.name}")
    if completion.selection is not None and completion.selection.reason:
        table.add_row("selection", completion.selection.reason)
    draft = pipe.draft_name if t.score > 0 else f"{pipe.draft_name} (not run)"
    table.add_row("model / draft", f"{completion.model or pipe.backend.model_name} / {draft}")
    if completion.fallback:
        table.add_row("fallback", completion.fallback)
    if pipe.warmed_up is not None:
        table.add_row("warm-up at load", f"{pipe.warmed_up.seconds:,.1f} s")
    for label, value in (
        ("score", t.score),
        ("select", t.select),
        ("prefill", t.prefill),
        ("TTFT", t.ttft),
        ("total", t.total),
    ):
        table.add_row(f"{label}", f"{value:,.1f} ms")
    return table


def main(args: argparse.Namespace) -> int:
    """Load the pipeline, answer the prompt, print the answer and statistics; returns the exit status."""
    _configure_logging(getattr(args, "verbose", 0))
    given = _prompt_input(args)

    from ..policies import DEFAULT_POLICY, load_pipeline, load_policy
    from ..runtime.settings import ExecutionSettings

    # --keep names a share, which the paper method takes as it is; auto decides the share itself.
    policy = load_policy(args.policy or ("paper" if args.keep is not None else DEFAULT_POLICY))
    policy = policy.with_overrides(keep_rate=args.keep)
    # Library code and the libraries below it may print; stdout belongs to the answer alone.
    with contextlib.redirect_stdout(sys.stderr):
        tracer_provider, meter_provider = None, None
        if getattr(args, "otel", "none") != "none":
            from ..tracing.setup import configure

            tracer_provider, meter_provider = configure(args.otel)
        pipe = load_pipeline(
            policy,
            model=args.model,
            draft=args.draft,
            device=args.device,
            dtype=args.dtype,
            tracer_provider=tracer_provider,
            meter_provider=meter_provider,
            execution=None if getattr(args, "compile", None) is None else ExecutionSettings(compile=args.compile),
        )
        prompt = _build_prompt(pipe, given, args.chat_template)
        sampling = {"max_tokens": args.max_tokens, "temperature": args.temperature, "seed": args.seed}
        completion = pipe.generate(prompt, **sampling) if args.json else None
    if completion is not None:
        sys.stdout.write(json.dumps(_json_result(completion, pipe, policy.name), ensure_ascii=False) + "\n")
        sys.stdout.flush()
        return 0
    for chunk in pipe.stream(prompt, **sampling):
        if chunk.text:
            sys.stdout.write(chunk.text)
            sys.stdout.flush()
        if chunk.completion is not None:
            completion = chunk.completion
    sys.stdout.write("\n")
    sys.stdout.flush()
    if completion is not None:
        from rich.console import Console

        Console(stderr=True).print(_stats_table(completion, pipe, policy.name))
    return 0
