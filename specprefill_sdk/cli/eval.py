"""``specprefill eval``: RULER-style tasks, every method at every keep rate; JSON + markdown + PNG.

A policy method (``policy:NAME``, ``auto``) runs once per sample: the policy picks its keep share.

Example::

    specprefill eval --tasks niah_single qa_squad --lengths 1024 2048 --samples 2 --out results/
    specprefill eval --model qwen2.5-coder-1.5b --draft qwen2.5-coder-0.5b --keep-rates 0.1 0.2
    specprefill eval --no-generate          # evidence recall only: no target model runs
    specprefill eval --methods draft-chunked auto policy:conservative --keep-rates 0.1 0.3
    specprefill eval --merge a.json b.json --name both   # one report over runs with other seeds
"""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import sys
from pathlib import Path

from ..errors import InvalidRequestError
from ..eval.harness import DEFAULT_KEEP_RATES, EvalConfig, EvalResult
from ..eval.methods import DEFAULT_METHODS, method_names
from ..eval.tasks import task_names
from ._args import add_model_options

__all__ = ["add_arguments", "main"]

logger = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``eval`` options to ``parser``."""
    add_model_options(parser)
    parser.add_argument(
        "--tasks",
        nargs="+",
        default=task_names(),
        metavar="TASK",
        help=f"tasks to run (default: all): {', '.join(task_names())}",
    )
    parser.add_argument(
        "--lengths",
        nargs="+",
        type=int,
        default=[1024, 2048, 4096, 8192],
        metavar="TOKENS",
        help="prompt lengths in target tokens (default: 1024 2048 4096 8192)",
    )
    parser.add_argument("--samples", type=int, default=2, help="samples per task and length (default: 2)")
    parser.add_argument(
        "--keep-rates",
        nargs="+",
        type=float,
        default=list(DEFAULT_KEEP_RATES),
        metavar="RATE",
        help="keep rates (default: 0.05 0.1 0.2 0.3 0.5)",
    )
    parser.add_argument(
        "--methods",
        nargs="+",
        default=list(DEFAULT_METHODS),
        metavar="METHOD",
        help=f"methods (default: all): {', '.join(method_names())}; draft-early-N: the draft's first N layers; "
        "policy:NAME: a policy preset or .toml file as users get it, run once (it picks its own keep share); "
        "auto: policy:auto",
    )
    parser.add_argument(
        "--no-generate",
        dest="generate",
        action="store_false",
        help="measure evidence recall only (the target does not answer)",
    )
    parser.add_argument(
        "--no-dense",
        dest="dense",
        action="store_false",
        help="skip the dense answers (the 'full' rows), e.g. when another run on the same samples has them",
    )
    parser.add_argument("--max-new-tokens", type=int, default=None, help="answer length (default: per task)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the samples and the random baseline")
    parser.add_argument("--out", default="eval-results", help="output folder (default: eval-results)")
    parser.add_argument("--name", default="eval", help="file name stem of the outputs (default: eval)")
    parser.add_argument("--no-plot", dest="plot", action="store_false", help="skip the PNG plot")
    parser.add_argument(
        "--merge",
        nargs="+",
        type=Path,
        default=None,
        metavar="JSON",
        help="run nothing: merge the result files of runs that differ only in their seed into one report "
        "(only --out, --name and --no-plot apply)",
    )
    parser.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")


def config_from_args(args: argparse.Namespace) -> EvalConfig:
    """The `EvalConfig` the parsed arguments describe (validated)."""
    config = EvalConfig(
        model=args.model,
        draft=args.draft,
        tasks=tuple(args.tasks),
        lengths=tuple(args.lengths),
        samples=args.samples,
        keep_rates=tuple(args.keep_rates),
        methods=tuple(args.methods),
        generate=args.generate,
        dense=args.dense,
        seed=args.seed,
        device=args.device,
        dtype=args.dtype,
        max_new_tokens=args.max_new_tokens,
    )
    config.validate()
    return config


def main(args: argparse.Namespace) -> int:
    """Run the evaluation the arguments describe and write its report; 0 on success.

    Raises:
        InvalidRequestError: invalid options (the CLI prints one line and exits with 2).
    """
    from rich.console import Console

    from ..eval.harness import run_eval
    from ..eval.report import markdown_report, write_report

    if getattr(args, "merge", None):
        return _merge(args)
    config = config_from_args(args)
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError as exc:
            raise InvalidRequestError(
                "the PNG plot needs matplotlib (pip install matplotlib), or pass --no-plot"
            ) from exc
    argv = sys.argv[sys.argv.index("eval") + 1 :] if "eval" in sys.argv else sys.argv[1:]
    command = "specprefill eval " + " ".join(shlex.quote(a) for a in argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    partial = out / f"{args.name}.partial.json"

    def checkpoint(so_far: EvalResult) -> None:
        # What a long run has measured so far, rewritten after every sample; removed at the end.
        data = so_far.to_dict()
        data["command"], data["partial"] = command, True
        partial.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")

    result = run_eval(config, progress=args.progress, on_sample=checkpoint)
    paths = write_report(result, args.out, stem=args.name, command=command, plot=args.plot)
    partial.unlink(missing_ok=True)
    console = Console()
    console.print(markdown_report(result, command=command), markup=False, highlight=False)
    for kind, path in paths.items():
        console.print(f"{kind}: {path}", markup=False, highlight=False)
    return 0


def _merge(args: argparse.Namespace) -> int:
    from ..eval.harness import merge_results
    from ..eval.report import load_result, write_report

    results = []
    for path in args.merge:
        try:
            results.append(load_result(path))
        except (OSError, ValueError) as exc:
            raise InvalidRequestError(f"cannot read {path}: {exc}", param="merge") from exc
    merged = merge_results(results)
    command = "specprefill eval --merge " + " ".join(shlex.quote(str(p)) for p in args.merge)
    paths = write_report(merged, args.out, stem=args.name, command=command, plot=args.plot)
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    return 0


if __name__ == "__main__":  # pragma: no cover - `python -m specprefill_sdk.cli.eval`
    parser = argparse.ArgumentParser(prog="specprefill eval", description=__doc__.splitlines()[0])
    add_arguments(parser)
    sys.exit(main(parser.parse_args()))
