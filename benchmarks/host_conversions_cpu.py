"""Per-request conversions between Python sequences and tensors: the Python way against the SDK's.

Each request converts its token ids and positions several times: the scorer's input tensor, the
check that kept positions strictly increase, the kept ids gathered from the prompt, the backend's
input tensors. With thousands of tokens these run per element in Python unless they go through C.
For a prompt of ``--n`` tokens with a ``--kept``-token selection, one CPU thread, minimum over
``--repeat`` rounds of ``--number`` calls each (``timeit``):

- the scorer's input: a zero tensor filled from `torch.tensor` of the ids (the code before
  `int64_tensor`) against `DraftAttentionScorer._padded` (one prompt);
- the backend's inputs for a fresh state: the kept (position, id) pairs listed and two
  `torch.tensor`s of nested lists (before) against two `int64_tensor` calls (``types.py``);
- `CompressedPrompt.from_selection`'s loops: the kept ids gathered and the positions checked by
  Python generators (before) against `operator.itemgetter` and `types._increasing`;
- the increasing check alone.

Usage::

    python benchmarks/host_conversions_cpu.py                   # results/host_conversions_cpu.{json,md}
"""

from __future__ import annotations

import argparse
import itertools
import operator
import os
import platform
import random
import sys
import timeit
from collections.abc import Callable
from typing import Any

import torch
from _common import add_output_args, command_line, write_results
from ttft_gpu import CONFIGS, build_model, synthetic_tokenizer, tiny

from specprefill_sdk.scoring import DraftAttentionScorer
from specprefill_sdk.types import _increasing, int64_tensor


def best_us(fn: Callable[[], Any], number: int, repeat: int) -> float:
    """The fastest of ``repeat`` rounds of ``number`` calls, in microseconds per call."""
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e6


def measure(n: int, kept: int, number: int, repeat: int) -> list[dict[str, Any]]:
    rng = random.Random(0)
    ids = tuple(rng.randrange(128_000) for _ in range(n))
    indices = tuple(sorted(rng.sample(range(n), kept)))
    tokenizer = synthetic_tokenizer(4096)
    scorer = DraftAttentionScorer(build_model("draft", tiny(CONFIGS["llama-3.2-1b"]), torch.device("cpu"), tokenizer))

    positions = indices
    kept_ids = tuple(ids[i] for i in indices)

    def python_scorer_input() -> torch.Tensor:  # what the scorer did before `int64_tensor`
        out = torch.zeros(1, n, dtype=torch.long)
        out[0, :] = torch.tensor(ids, dtype=torch.long)
        return out

    def python_backend_inputs() -> tuple[torch.Tensor, torch.Tensor]:  # the backend's prefill, before
        cached: dict[int, int] = {}
        new = [(p, t) for p, t in zip(positions, kept_ids, strict=True) if p not in cached]
        return (
            torch.tensor([[t for _, t in new]], dtype=torch.long),
            torch.tensor([[p for p, _ in new]], dtype=torch.long),
        )

    def python_gather_and_check() -> bool:  # from_selection's and CompressedPrompt's loops, before
        picked = tuple(ids[i] for i in indices)
        return bool(picked) and not any(b <= a for a, b in itertools.pairwise(indices))

    def sdk_gather_and_check() -> bool:
        picked = operator.itemgetter(*indices)(ids)
        return bool(picked) and _increasing(indices)

    pairs: list[tuple[str, Callable[[], Any], Callable[[], Any]]] = [
        (f"scorer input, {n} ids", python_scorer_input, lambda: scorer._padded([ids])),
        (
            f"backend inputs, {kept} kept ids and positions",
            python_backend_inputs,
            lambda: (int64_tensor(kept_ids), int64_tensor(positions)),
        ),
        (f"gather {kept} of {n} ids and check their positions", python_gather_and_check, sdk_gather_and_check),
        (
            f"check that {kept} positions increase",
            lambda: not any(b <= a for a, b in itertools.pairwise(indices)),
            lambda: _increasing(indices),
        ),
    ]
    rows = []
    for name, python_way, sdk_way in pairs:
        python_us, sdk_us = best_us(python_way, number, repeat), best_us(sdk_way, number, repeat)
        rows.append({"what": name, "python_us": python_us, "sdk_us": sdk_us, "ratio": python_us / sdk_us})
    return rows


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "# Per-request conversions: the Python way against the SDK's",
        "",
        f"- machine: {result['environment']['platform']}, {result['environment']['cpu_count']} CPUs, "
        f"torch {result['environment']['torch']}, one thread",
        f"- command: `{result['command']}`; minimum of {result['repeat']} rounds of {result['number']} calls",
        "",
        "| what | Python us | SDK us | ratio |",
        "|---|---:|---:|---:|",
    ]
    for r in result["rows"]:
        lines.append(f"| {r['what']} | {r['python_us']:.1f} | {r['sdk_us']:.1f} | {r['ratio']:.1f}x |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=4096, help="prompt tokens")
    parser.add_argument("--kept", type=int, default=1248, help="kept tokens")
    parser.add_argument("--number", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=5)
    add_output_args(parser, "host_conversions_cpu")
    args = parser.parse_args()
    torch.set_num_threads(1)
    result: dict[str, Any] = {
        "benchmark": "host_conversions_cpu",
        "command": command_line(),
        "environment": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "platform": platform.platform(),
            "cpu_count": os.cpu_count(),
        },
        "number": args.number,
        "repeat": args.repeat,
        "rows": measure(args.n, args.kept, args.number, args.repeat),
    }
    sys.stdout.write(write_results(args.out, args.name, result, markdown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
