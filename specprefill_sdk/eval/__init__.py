"""Evaluation: RULER-style tasks from real text shipped in PyPI packages, and the harness that runs them.

Example::

    from specprefill_sdk.eval import EvalConfig, run_eval, write_report
    result = run_eval(EvalConfig(tasks=("niah_single",), lengths=(1024,), samples=2, keep_rates=(0.1, 0.3)))
    write_report(result, "eval-results")
"""

from __future__ import annotations

from .harness import DEFAULT_KEEP_RATES, EvalConfig, EvalResult, merge_results, run_eval
from .methods import DEFAULT_METHODS, METHOD_DESCRIPTIONS, build_methods, method_names
from .metrics import contains_match, evidence_recall, exact_match, normalize_answer
from .report import markdown_report, plot_report, write_report
from .tasks import TASKS, EvalSample, generate_samples, task_names
from .text import sentence_spans, split_sentences

__all__ = [
    "DEFAULT_KEEP_RATES",
    "DEFAULT_METHODS",
    "METHOD_DESCRIPTIONS",
    "TASKS",
    "EvalConfig",
    "EvalResult",
    "EvalSample",
    "build_methods",
    "contains_match",
    "evidence_recall",
    "exact_match",
    "generate_samples",
    "markdown_report",
    "merge_results",
    "method_names",
    "normalize_answer",
    "plot_report",
    "run_eval",
    "sentence_spans",
    "split_sentences",
    "task_names",
    "write_report",
]
