"""Does a prompt's draft selection depend on what else the draft scored? (one GPU, no vLLM needed)

With `--scoring-batch-tokens` the server's scoring queue scores concurrent prompts in one `score_batch` call,
left-padded to the longest; a prompt scored alone can also follow longer prompts whose look-ahead buffers the
scorer keeps.
This scores random-id prompts with the Llama-3.2-1B architecture (random weights, bf16, the server's
draft settings) under the paper policy and compares each prompt's scores and selection:

- alone, first in a fresh scorer, against alone again after a longer prompt (buffers kept from it);
- alone against in a batch with longer prompts (padded) and with prompts of its own length (unpadded).

Usage (on the device, the checkout on PYTHONPATH): python3 batch_scores_gpu.py OUT_DIR TOKENIZER_DIR
(a third argument, ``tiny``, runs the same on a 4-layer random Llama on the CPU at a fifth of the lengths: a
check of the script).
``python3 batch_scores_gpu.py --render RESULT.json`` writes RESULT.md from a run's JSON.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import vllm_gpu as base
import vllm_serve_gpu as serving

from specprefill_sdk.policies import load_policy
from specprefill_sdk.types import Prompt

#: The prompts' lengths and the longer prompts' on the GPU, and in the CPU check of the script.
GPU_LENGTHS, GPU_LONGER = (1500, 2200, 3000, 4000), 6000
TINY_LENGTHS, TINY_LONGER = (300, 440, 600, 800), 1200


def random_ids(n: int, seed: int, high: int = 49152) -> list[int]:
    """Python's generator, not `vllm_serve_gpu.random_ids`'s numpy one: the prompts of the committed run."""
    rng = random.Random(seed)
    return [rng.randrange(3, high) for _ in range(n)]


def render(result: dict[str, Any]) -> str:
    """The run's rows as a markdown table, with what ran."""
    lines = [
        f"# A prompt's draft scores alone and beside others ({result['device']})",
        "",
        "Command: `python3 benchmarks/serve_gpu/2026-12-07/batch_scores_gpu.py OUT TOKENIZER` (the checkout, and on "
        "the device the vLLM payload's `/tmp/site` for pydantic, on `PYTHONPATH`).",
        "",
        f"Draft: {result['draft']}; scorer `{result['scorer']}` (the paper policy's), `{result['execution']}`; "
        "selection: the paper policy (keep 0.1, chunks of 32). Random-id prompts of "
        f"{' / '.join(f'{n:,}' for n in result.get('lengths', GPU_LENGTHS))} tokens, each first scored alone in a "
        "fresh scorer; each batch puts it first beside three other prompts.",
        "",
        "| case | scores bitwise equal | largest score difference | look-ahead tokens equal | selection equal |",
        "| --- | --- | ---: | --- | --- |",
    ]

    def yes(flag: bool) -> str:
        return "yes" if flag else "no"

    for r in result["rows"]:
        lines.append(
            f"| {r['case']} | {yes(r['scores_equal'])} | {r['max_score_diff']:.2g} | "
            f"{yes(r['look_ahead_equal'])} | {yes(r['selection_equal'])} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    if sys.argv[1] == "--render":
        source = Path(sys.argv[2])
        source.with_suffix(".md").write_text(render(json.loads(source.read_text())))
        return 0
    out, tokenizer = Path(sys.argv[1]), Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    tiny = sys.argv[3:] == ["tiny"]
    device = "cpu" if tiny else "cuda"
    path = (
        base.make_model("llama", Path("/tmp/models/tiny-batch"), tokenizer, seed=1)
        if tiny
        else serving.llama_dir("1b", tokenizer, weights=True)
    )
    policy = load_policy("paper")
    # bf16 on the GPU, as served; the CPU check takes what "auto" loads (fp32 where the CPU lacks bf16 instructions)
    scorer = policy.build_scorer(str(path), device=device, dtype="auto" if tiny else "bfloat16")
    scorer.warmup()
    selector = policy.build_selector()
    # the CPU check runs a fifth of the lengths: it checks the script, and the GPU run's lengths take minutes there
    lengths, long_n = (TINY_LENGTHS, TINY_LONGER) if tiny else (GPU_LENGTHS, GPU_LONGER)
    prompts = {n: Prompt.from_token_ids(random_ids(n, seed=n)) for n in lengths}
    longer = [Prompt.from_token_ids(random_ids(long_n, seed=100 + k)) for k in range(3)]
    same = {n: [Prompt.from_token_ids(random_ids(n, seed=n + 1 + k)) for k in range(3)] for n in prompts}

    def compare(a: Any, b: Any, p: Prompt) -> dict[str, Any]:
        return {
            "scores_equal": bool(torch.equal(a.values, b.values)),
            "max_score_diff": float((a.values - b.values).abs().max()),
            "look_ahead_equal": a.info["look_ahead_token_ids"] == b.info["look_ahead_token_ids"],
            "selection_equal": selector.select(p, a).indices == selector.select(p, b).indices,
        }

    rows = []
    first = {}
    for n, p in prompts.items():  # shortest first: each alone with buffers no larger than its own
        first[n] = scorer.score(p)
    scorer.score(longer[0])  # buffers for the longer prompt now kept
    for n, p in prompts.items():
        again = compare(scorer.score(p), first[n], p)
        rows.append({"case": f"{n}: alone after a {long_n:,}-token prompt vs alone first", **again})
    for n, p in prompts.items():
        rows.append({"case": f"{n}: in a padded batch with three {long_n:,}-token prompts vs alone",
                     **compare(scorer.score_batch([p, *longer])[0], first[n], p)})  # fmt: skip
        rows.append({"case": f"{n}: in a batch with three prompts of its length vs alone",
                     **compare(scorer.score_batch([p, *same[n]])[0], first[n], p)})  # fmt: skip
    result = {"device": "cpu" if tiny else torch.cuda.get_device_name(),
              "draft": "tiny random Llama" if tiny else "Llama-3.2-1B architecture, random weights, bf16",
              "scorer": repr(scorer), "execution": repr(scorer.execution), "lengths": list(lengths),
              "longer": long_n, "rows": rows}  # fmt: skip
    (out / "batch_scores_gpu.json").write_text(json.dumps(result, indent=1))
    (out / "batch_scores_gpu.md").write_text(render(result))
    for r in rows:
        print(r)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
