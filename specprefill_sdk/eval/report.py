"""Write an `EvalResult` as JSON, a markdown table and a PNG plot (accuracy and recall vs keep rate).

Policy methods (``policy:NAME``, ``auto``) chose their keep share: they get a table of their own
(one row each, with the share they kept) and one marker each in the plot, at that share.

Example::

    paths = write_report(result, "benchmarks/results", stem="eval_smollm2")
    paths["markdown"].read_text()
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from .harness import FULL, POLICY, EvalResult
from .methods import is_method, method_description, method_order

__all__ = ["load_result", "markdown_report", "plot_report", "write_report"]


def _fmt(value: Any, percent: bool = True) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{100 * value:.0f}" if percent else f"{value:.2f}"


def _methods(summary: dict[str, Any]) -> list[str]:
    """The methods measured at keep rates (neither the dense reference nor a policy)."""
    return method_order([m for m in summary if m != FULL and POLICY not in summary[m]])


def _policies(summary: dict[str, Any]) -> list[str]:
    """The policy methods: measured once, at the share their policy chose."""
    return method_order([m for m in summary if POLICY in summary[m]])


def _policy_table(summary: dict[str, Any], judged: bool) -> list[str]:
    metrics = ["keep_ratio", "recall"] + (["contains", "exact"] if judged else [])
    names = {"keep_ratio": "kept share", "recall": "recall", "contains": "contains", "exact": "exact"}
    lines = ["| policy | " + " | ".join(names[m] for m in metrics) + " |", "|---|" + "---:|" * len(metrics)]
    for m in _policies(summary):
        stats = summary[m][POLICY]
        lines.append(f"| {m} | " + " | ".join(_fmt(stats.get(x)) for x in metrics) + " |")
    return lines


def _table(summary: dict[str, Any], rates: list[float], metric: str, with_full: bool) -> list[str]:
    head = "| method | " + " | ".join(f"keep {r:g}" for r in rates) + " |"
    lines = [head, "|---|" + "---:|" * len(rates)]
    if with_full and FULL in summary:
        full = summary[FULL].get(1.0, {}).get(metric)
        lines.append("| full (dense) | " + " | ".join(_fmt(full) for _ in rates) + " |")
    for m in _methods(summary):
        cells = [_fmt(summary[m].get(r, {}).get(metric)) for r in rates]
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return lines


def markdown_report(result: EvalResult, *, command: str | None = None) -> str:
    """Markdown: the configuration, then recall, accuracy (contains, exact) and keep-ratio tables."""
    cfg = result.config
    env = result.environment
    summary = result.summary()
    rates = list(cfg.keep_rates)
    judged = any("contains" in v for rates_ in summary.values() for v in rates_.values())
    lines = [
        f"# Evaluation: target `{cfg.model}`, draft `{cfg.draft or cfg.model}`",
        "",
        f"- tasks: {', '.join(cfg.tasks)}",
        f"- lengths (tokens): {', '.join(str(n) for n in cfg.lengths)}; samples per task and length: {cfg.samples}; "
        + (
            "seeds " + ", ".join(str(src["seed"]) for src in result.sources)
            if len(result.sources) > 1
            else f"seed {cfg.seed}"
        ),
        f"- samples in all: {len(result.samples)}; measurements: {len(result.records)}; "
        f"run time {result.elapsed_s / 60:.1f} min",
        f"- machine: {env.get('gpu') or env.get('processor', '?')}, {env.get('cpu_count', '?')} CPUs, "
        f"torch {env.get('torch', '?')}, transformers {env.get('transformers', '?')}, {env.get('device', '?')}, "
        f"{env.get('dtype', '?')}",
    ]
    if len(result.sources) > 1:
        lines.append(f"- merged from {len(result.sources)} runs:")
        lines += [
            f"  - seed {src['seed']}, {src['samples']} sample(s) per task and length: `{src.get('command') or '?'}`"
            for src in result.sources
        ]
    if command:
        lines.append(f"- command: `{command}`")
    lines += [
        "",
        "Numbers are percentages, means over samples. Protected tokens (attention sink, question, generation "
        "prompt) count toward the keep rate.",
        "",
        "## Evidence-token recall (independent of the target)",
        "",
        *_table(summary, rates, "recall", with_full=False),
    ]
    if judged:
        lines += [
            "",
            "## Accuracy, contains (the expected answer appears in the output)",
            "",
            *_table(summary, rates, "contains", with_full=True),
            "",
            "## Accuracy, exact (the first output line is the answer and nothing else)",
            "",
            *_table(summary, rates, "exact", with_full=True),
        ]
    lines += ["", "## Kept share of the prompt (actual)", "", *_table(summary, rates, "keep_ratio", with_full=False)]
    if _policies(summary):
        lines += ["", "## Policies (each chose its keep share; run once, whatever the keep rates)", ""]
        lines += _policy_table(summary, judged)
    by_task = result.summary(by_task=True)
    if by_task and len(cfg.tasks) > 1:
        metric = "contains" if judged else "recall"
        lines += ["", f"## Per task: {'accuracy (contains)' if judged else 'evidence recall'}", ""]
        for task, tsum in by_task.items():
            lines += [f"### {task}", "", *_table(tsum, rates, metric, with_full=judged), ""]
            if _policies(tsum):
                lines += [*_policy_table(tsum, judged), ""]
    if result.errors:
        lines += ["", "## Errors", ""]
        seen = set()
        for e in result.errors:
            key = (e.get("method"), e.get("error"))
            if key in seen:
                continue
            seen.add(key)
            lines.append(f"- {e.get('method')}: {e.get('error')}")
    lines += ["", "## Methods", ""]
    lines += [f"- `{m}`: {method_description(m)}" for m in _methods(summary) + _policies(summary) if is_method(m)]
    return "\n".join(lines).rstrip() + "\n"


def plot_report(result: EvalResult, path: str | Path) -> Path:
    """A PNG with evidence recall (and accuracy, when generated) against the keep rate, one line per method.

    A policy method is one star at the share it kept.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = result.summary()
    rates = list(result.config.keep_rates)
    judged = any("contains" in v for rates_ in summary.values() for v in rates_.values())
    panels = [("recall", "evidence-token recall")] + ([("contains", "accuracy (contains)")] if judged else [])
    # Constrained layout makes room below the panels for the legend, which then covers no data.
    fig, axes = plt.subplots(1, len(panels), figsize=(6.2 * len(panels), 4.6), squeeze=False, layout="constrained")
    methods = _methods(summary)
    cmap = plt.get_cmap("tab10")
    for ax, (metric, label) in zip(axes[0], panels, strict=True):
        for i, m in enumerate(methods):
            ys = [summary[m].get(r, {}).get(metric, float("nan")) for r in rates]
            style = "-" if m.startswith("draft-") else "--"
            ax.plot(
                rates,
                [100 * y for y in ys],
                style,
                marker="o",
                color=cmap(i % 10),
                label=m,
                linewidth=1.6,
                markersize=4,
            )
        for j, m in enumerate(_policies(summary)):
            stats = summary[m][POLICY]
            ax.plot(
                [stats["keep_ratio"]],
                [100 * stats.get(metric, float("nan"))],
                linestyle="none",
                marker="*",
                markersize=11,
                color=cmap((len(methods) + j) % 10),
                label=f"{m} (its own share)",
            )
        if metric == "contains" and FULL in summary:
            full = summary[FULL].get(1.0, {}).get("contains")
            if full is not None:
                ax.axhline(100 * full, color="black", linestyle=":", linewidth=1.2, label="full (dense)")
        ax.set_xscale("log")
        ax.set_xticks(rates)
        ax.set_xticklabels([f"{r:g}" for r in rates])
        ax.set_xlabel("keep rate")
        ax.set_ylabel(f"{label} (%)")
        ax.set_ylim(-3, 103)
        ax.grid(True, alpha=0.3)
    handles, labels = axes[0][-1].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=min(len(labels), 6), fontsize=9, frameon=False)
    cfg = result.config
    lengths = f"{min(cfg.lengths)}-{max(cfg.lengths)}" if len(cfg.lengths) > 1 else f"{cfg.lengths[0]}"
    fig.suptitle(
        f"target {cfg.model}, draft {cfg.draft or cfg.model}\n{len(result.samples)} samples, "
        f"{len(cfg.tasks)} tasks, {lengths} tokens",
        fontsize=9,
    )
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def load_result(path: str | Path) -> EvalResult:
    """Read an `EvalResult` back from the JSON that `write_report` wrote (to re-plot, re-tabulate or merge it)."""
    return EvalResult.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))


def write_report(
    result: EvalResult, directory: str | Path, *, stem: str = "eval", command: str | None = None, plot: bool = True
) -> dict[str, Path]:
    """Write ``<stem>.json``, ``<stem>.md`` and (``plot=True``) ``<stem>.png`` into ``directory``."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    data = result.to_dict()
    if command:
        data["command"] = command
    paths = {"json": d / f"{stem}.json", "markdown": d / f"{stem}.md"}
    paths["json"].write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    paths["markdown"].write_text(markdown_report(result, command=command), encoding="utf-8")
    if plot:
        paths["png"] = plot_report(result, d / f"{stem}.png")
    return paths
