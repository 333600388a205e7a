"""Per-length, per-task tables from the merged ``quality_gpu_qwen_real_*`` results.

Writes ``benchmarks/results/quality_gpu_qwen_real_summary.md``. The dense row comes from the first
wave's files; the other waves re-ran it on the same samples.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent.parent / "results"
TASKS = ["niah_single", "niah_multikey", "niah_multivalue", "variable_tracking", "qa_squad", "qa_hotpot"]
LENGTHS = [(4096, "4k"), (8192, "8k"), (16384, "16k"), (32768, "32k")]
PREFIXES = ("", "keep023_", "la1_random_")
ROWS = [
    ("full", 1.0, ""),
    ("draft-chunked", 0.1, ""),
    ("draft-adaptive", 0.1, ""),
    ("draft-chunked", 0.2, "keep023_"),
    ("draft-chunked", 0.3, "keep023_"),
    ("draft-chunked-la1", 0.1, "la1_random_"),
    ("random", 0.1, "la1_random_"),
]
METRICS = (
    ("contains", "Accuracy (contains)"),
    ("exact", "Accuracy (exact)"),
    ("recall", "Evidence-token recall"),
    ("keep_ratio", "Kept share (actual)"),
)


def _load(prefix: str, length: str) -> dict[str, Any]:
    return json.loads((RESULTS / f"quality_gpu_qwen_real_{prefix}{length}.json").read_text())


def _row(records: list[dict[str, Any]], method: str, rate: float, metric: str) -> str:
    by_task: dict[str, list[float]] = defaultdict(list)
    for r in records:
        if r["method"] == method and float(r["keep_rate"]) == rate and r.get(metric) is not None:
            by_task[r["task"]].append(float(r[metric]))
    cells = [f"{100 * sum(by_task[t]) / len(by_task[t]):.0f}" if by_task[t] else "n/a" for t in TASKS]
    values = [v for t in TASKS for v in by_task[t]]
    counts = "/".join(str(c) for c in sorted({len(by_task[t]) for t in TASKS}))
    mean = f"{100 * sum(values) / len(values):.1f}" if values else "n/a"
    return f"| {method} | {rate:g} | " + " | ".join(cells) + f" | {mean} | {counts} per task |"


def main() -> None:
    out = [
        "# Real-weight quality on one H200: Qwen2.5-Coder-1.5B target, 0.5B draft",
        "",
        "Built by `benchmarks/quality_gpu/summarize.py` from the merged result files "
        "`quality_gpu_qwen_real_{,keep023_,la1_random_}<len>.json` (each: `specprefill eval --merge` of seeds 0 "
        "and 1, 10 samples each, so 20 samples per task and length). The dense (`full`) row is from the first "
        "file; the other two files re-ran it on the same samples. 32768 is sized by the harness to 32672 prompt "
        "tokens (32768 minus 96 tokens of answer room). Numbers: percent.",
        "",
    ]
    for metric, title in METRICS:
        out += [f"## {title}", ""]
        for length, stem in LENGTHS:
            data = {p: _load(p, stem) for p in PREFIXES}
            ns = [r["n"] for r in data[""]["records"] if r["method"] == "full"]
            out += [
                f"### {length} tokens (prompt n: mean {sum(ns) / len(ns):.0f}, min {min(ns)}, max {max(ns)})",
                "",
                "| method | keep | " + " | ".join(TASKS) + " | mean | samples |",
                "|---|---:|" + "---:|" * (len(TASKS) + 2),
            ]
            for method, rate, prefix in ROWS:
                if metric in ("recall", "keep_ratio") and method == "full":
                    continue
                out.append(_row(data[prefix]["records"], method, rate, metric))
            out.append("")
    (RESULTS / "quality_gpu_qwen_real_summary.md").write_text("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
