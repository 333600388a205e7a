"""The ``specprefill`` command: a dispatcher over subcommands, each a module imported only when used.

Subcommands: ``run`` (answer one prompt), ``serve`` (the OpenAI-compatible server), ``eval`` (the
evaluation harness), ``policies`` (list the presets) and ``models`` (list the bundled models).
Each lives in a module with ``add_arguments(parser)`` and ``main(args) -> int``.

Every error the SDK raises on purpose is printed as one line starting with ``error:`` on stderr,
with exit status 2; no traceback reaches the user unless ``--verbose`` is given twice.

Example::

    specprefill run --prompt-file essay.txt --keep 0.1 --max-tokens 64 --json
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import NoReturn

from ..errors import SpecPrefillError

__all__ = ["COMMANDS", "main"]

logger = logging.getLogger(__name__)

#: Exit status for errors in the input (bad arguments, unknown model, prompt too long, ...).
EXIT_USAGE = 2
#: Exit status for unexpected failures.
EXIT_FAILURE = 1
#: Exit status after Ctrl-C (128 + SIGINT).
EXIT_INTERRUPTED = 130


@dataclass(frozen=True)
class Command:
    """A subcommand: the module that implements it and the extra that installs its dependencies."""

    module: str
    help: str
    extra: str | None = None


COMMANDS: dict[str, Command] = {
    "run": Command("specprefill_sdk.cli.run", "answer one prompt with speculative prefill"),
    "serve": Command("specprefill_sdk.cli.serve", "run the OpenAI-compatible HTTP server", extra="server"),
    "eval": Command("specprefill_sdk.cli.eval", "evaluate policies on long-context tasks", extra="eval"),
    "policies": Command("specprefill_sdk.cli.policies", "list the policy presets or show one"),
    "models": Command("specprefill_sdk.cli.models", "list the bundled models"),
}

#: Optional third-party modules and the extra that installs each.
_OPTIONAL_MODULES = {
    "fastapi": "server",
    "uvicorn": "server",
    "starlette": "server",
    "matplotlib": "eval",
    "opentelemetry.sdk": "otel",
    "opentelemetry.exporter": "otel",
}


class CommandUnavailable(SpecPrefillError):
    """A subcommand whose module or optional dependencies are not installed."""


class _Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one ``error:`` line on stderr."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"error: {message} (see '{self.prog} --help')\n")


def _extra_for(exc: ModuleNotFoundError) -> str | None:
    name = exc.name or ""
    for module, extra in _OPTIONAL_MODULES.items():
        if name == module or name.startswith(module + "."):
            return extra
    return None


def _unavailable(command: str, exc: ModuleNotFoundError) -> CommandUnavailable:
    extra = _extra_for(exc) or COMMANDS[command].extra
    if exc.name and exc.name.startswith("specprefill_sdk"):
        return CommandUnavailable(f"the '{command}' command is not available in this installation ({exc.name})")
    hint = f": install specprefill-sdk[{extra}]" if extra else ""
    return CommandUnavailable(f"'specprefill {command}' needs the module '{exc.name}', which is not installed{hint}")


def _load(command: str) -> ModuleType:
    try:
        return importlib.import_module(COMMANDS[command].module)
    except ModuleNotFoundError as exc:
        raise _unavailable(command, exc) from None


def _command_in(argv: Sequence[str]) -> str | None:
    """The subcommand named in ``argv``: the first word that is not an option."""
    for word in argv:
        if not word.startswith("-"):
            return word
        if word == "--":
            return None
    return None


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The top-level parser and one (still empty) parser per subcommand."""
    from .. import __version__

    parser: argparse.ArgumentParser = _Parser(
        prog="specprefill",
        description="Speculative prefill: a small draft model picks the prompt tokens a large model prefills.",
    )
    parser.add_argument("--version", action="version", version=f"specprefill-sdk {__version__}")
    parser.add_argument(
        "-v", "--verbose", action="count", default=0, help="log more to stderr (-vv also shows tracebacks)"
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subs: dict[str, argparse.ArgumentParser] = {
        name: subparsers.add_parser(name, help=cmd.help, description=cmd.help) for name, cmd in COMMANDS.items()
    }
    return parser, subs


def _error(message: str) -> None:
    first_line = " ".join(str(message).split())
    sys.stderr.write(f"error: {first_line}\n")
    sys.stderr.flush()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``specprefill`` command line; returns the exit status."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    verbose = sum(a.count("v") for a in args_list if a.startswith("-") and set(a[1:]) == {"v"})
    verbose += args_list.count("--verbose")
    try:
        parser, subs = build_parser()
        command = _command_in(args_list)
        module = None
        if command in COMMANDS:
            module = _load(command)
            module.add_arguments(subs[command])
        args = parser.parse_args(args_list)
        if module is None:
            parser.print_help(sys.stderr)
            return EXIT_USAGE
        return int(module.main(args) or 0)
    except KeyboardInterrupt:
        sys.stderr.write("\ninterrupted\n")
        return EXIT_INTERRUPTED
    except SpecPrefillError as exc:
        if verbose > 1:
            traceback.print_exc()
        _error(exc.message)
        return EXIT_USAGE
    except ModuleNotFoundError as exc:
        extra = _extra_for(exc)
        if extra is None or not command:
            return _unexpected(exc, verbose)
        if verbose > 1:
            traceback.print_exc()
        _error(_unavailable(command, exc).message)
        return EXIT_USAGE
    except BrokenPipeError:
        # The reader went away (e.g. `| head`): nothing left to say, and nobody to say it to.
        sys.stderr.close()
        return EXIT_FAILURE
    except Exception as exc:
        return _unexpected(exc, verbose)


def _unexpected(exc: BaseException, verbose: int) -> int:
    if verbose > 1:
        traceback.print_exc()
    _error(f"unexpected {type(exc).__name__}: {exc} (run with -vv for the traceback)")
    return EXIT_FAILURE


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
