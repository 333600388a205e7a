"""Run the evaluation: tasks x lengths x samples, every method at every keep rate.

Two metrics per (sample, method, keep rate):

- **evidence recall**: the share of the evidence tokens (needle sentences, supporting sentences) that
  the selection keeps; needs only the draft (the target only for ``target-early-*`` methods, which
  score with the target's own first layers);
- **accuracy** (with ``generate=True``): the target prefills the kept tokens at their original
  positions and answers greedily; the answer is scored ``contains`` (every / any expected answer
  appears) and ``exact`` (the first line is the answer and nothing else). The dense prompt ("full")
  is the reference.

A policy method (``policy:NAME``, ``auto``) decides its own keep share: it runs once per sample, not
at each keep rate, and its records and summary carry the keep rate `POLICY` (the share it actually
kept is ``keep_ratio``).

Example::

    from specprefill_sdk.eval import EvalConfig, run_eval
    result = run_eval(EvalConfig(tasks=("niah_single",), lengths=(1024,), samples=2, keep_rates=(0.1,)))
    result.summary()["draft-chunked"][0.1]["recall"]
"""

from __future__ import annotations

import contextlib
import logging
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any

import torch

from ..errors import InvalidRequestError
from ..models import LoadedModel, load_model
from ..pipeline import compress_prompts
from ..prompt import build_prompt
from ..types import CompressedPrompt, Prompt, SamplingParams, Selection, TokenScores
from .methods import DEFAULT_METHODS, Method, build_methods, is_method, method_names
from .metrics import contains_match, evidence_recall, exact_match, token_mask_for_spans
from .tasks import EvalSample, generate_samples, task_names

__all__ = ["DEFAULT_KEEP_RATES", "POLICY", "EvalConfig", "EvalResult", "RateKey", "merge_results", "run_eval"]

logger = logging.getLogger(__name__)

DEFAULT_KEEP_RATES: tuple[float, ...] = (0.05, 0.1, 0.2, 0.3, 0.5)
#: The row name of the dense reference (every token prefilled).
FULL = "full"
#: The keep rate of a policy method's records and summary: the policy chose the share it kept.
POLICY = "policy"
#: A summary's rate key: a keep rate, or `POLICY` for a policy method.
RateKey = float | str
#: Positions left free at the end of the context for the answer when sizing prompts.
_ANSWER_ROOM = 96


@dataclass(frozen=True)
class EvalConfig:
    """What to run. ``draft=None`` uses the target as its own draft."""

    model: str = "smollm2-135m"
    draft: str | None = None
    tasks: tuple[str, ...] = tuple(task_names())
    lengths: tuple[int, ...] = (1024, 2048, 4096, 8192)
    samples: int = 2
    keep_rates: tuple[float, ...] = DEFAULT_KEEP_RATES
    methods: tuple[str, ...] = DEFAULT_METHODS
    generate: bool = True
    #: answer the dense prompt too (the ``full`` rows); off when another run on the same samples has them
    dense: bool = True
    seed: int = 0
    device: str = "auto"
    dtype: str = "auto"
    max_new_tokens: int | None = None

    def validate(self) -> None:
        """Raise `InvalidRequestError` for values that cannot run."""
        unknown = [t for t in self.tasks if t not in task_names()]
        if unknown or not self.tasks:
            raise InvalidRequestError(
                f"unknown or no task(s) {unknown}; choose from {', '.join(task_names())}", param="tasks"
            )
        bad = [m for m in self.methods if not is_method(m)]
        if bad:
            raise InvalidRequestError(
                f"unknown method(s) {', '.join(bad)}; choose from {', '.join(method_names())}, "
                "draft-early-N[-AGG], target-early-N[-AGG] or policy:NAME (a preset or .toml file that loads)",
                param="methods",
            )
        if not self.lengths or any(not isinstance(n, int) or n < 256 for n in self.lengths):
            raise InvalidRequestError("lengths must be integers >= 256", param="lengths")
        if not self.keep_rates or any(not 0 < r <= 1 for r in self.keep_rates):
            raise InvalidRequestError("keep rates must lie in (0, 1]", param="keep_rates")
        if self.samples < 1:
            raise InvalidRequestError("samples must be >= 1", param="samples")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise InvalidRequestError("max_new_tokens must be >= 1", param="max_new_tokens")


@dataclass
class EvalResult:
    """Everything a run produced: the configuration, the machine, one record per measurement."""

    config: EvalConfig
    records: list[dict[str, Any]] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)
    errors: list[dict[str, str]] = field(default_factory=list)
    environment: dict[str, Any] = field(default_factory=dict)
    started: str = ""
    elapsed_s: float = 0.0
    #: the command that produced it, when read back from a file that records one
    command: str | None = None
    #: for a result of `merge_results`: one entry per run it holds (seed, samples, command, run time)
    sources: list[dict[str, Any]] = field(default_factory=list)

    def summary(self, by_task: bool = False) -> dict[str, Any]:
        """Means per method and keep rate: ``{method: {rate: {recall, contains, exact, keep_ratio, count}}}``.

        With ``by_task``: ``{task: {method: {rate: ...}}}``. The dense reference is the method
        ``full`` at rate 1.0; a policy method has the one rate `POLICY`.
        """
        groups: dict[tuple[str, str, RateKey], list[dict[str, Any]]] = {}
        for r in self.records:
            key = (r["task"] if by_task else "", r["method"], _rate_key(r["keep_rate"]))
            groups.setdefault(key, []).append(r)
        out: dict[str, Any] = {}
        for (task, method, rate), rows in groups.items():
            stats: dict[str, Any] = {
                "count": len(rows),
                "keep_ratio": _mean([r["keep_ratio"] for r in rows]),
                "recall": _mean([r["recall"] for r in rows]),
            }
            judged = [r for r in rows if r.get("contains") is not None]
            if judged:
                stats["contains"] = _mean([float(r["contains"]) for r in judged])
                stats["exact"] = _mean([float(r["exact"]) for r in judged])
            select_ms = [r["select_ms"] for r in rows if r.get("select_ms") is not None]
            if select_ms:
                stats["select_ms"] = _mean(select_ms)
            target = out.setdefault(task, {}) if by_task else out
            target.setdefault(method, {})[rate] = stats
        return out

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: config, environment, summary (overall and per task), samples, records, errors."""

        def keyed(summary: dict[str, Any]) -> dict[str, Any]:
            return {m: {_rate_text(rate): v for rate, v in rates.items()} for m, rates in summary.items()}

        data = {
            "config": asdict(self.config),
            "environment": self.environment,
            "started": self.started,
            "elapsed_s": round(self.elapsed_s, 1),
            "summary": keyed(self.summary()),
            "summary_by_task": {t: keyed(s) for t, s in self.summary(by_task=True).items()},
            "samples": self.samples,
            "errors": self.errors,
            "records": self.records,
        }
        if self.sources:
            data["sources"] = self.sources
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EvalResult:
        """The result a JSON file written by `write_report` (or `specprefill eval`) holds.

        Raises:
            InvalidRequestError: the data lacks the configuration or the records (e.g. another file).
        """
        if not isinstance(data, dict) or not isinstance(data.get("config"), dict) or "records" not in data:
            raise InvalidRequestError("not an evaluation result: it needs 'config' and 'records'", param="merge")
        cfg = dict(data["config"])
        for key in ("tasks", "lengths", "keep_rates", "methods"):
            if key in cfg:
                cfg[key] = tuple(cfg[key])
        try:
            config = EvalConfig(**cfg)
        except TypeError as exc:
            raise InvalidRequestError(f"the result's configuration does not fit this version: {exc}") from exc
        return cls(
            config=config,
            records=list(data["records"]),
            samples=list(data.get("samples", [])),
            errors=list(data.get("errors", [])),
            environment=dict(data.get("environment", {})),
            started=str(data.get("started", "")),
            elapsed_s=float(data.get("elapsed_s") or 0.0),
            command=data.get("command"),
            sources=list(data.get("sources") or []),
        )


#: what runs must share to be merged (the samples may differ: other seeds)
_MERGE_FIELDS = (
    "model",
    "draft",
    "tasks",
    "lengths",
    "keep_rates",
    "methods",
    "generate",
    "dense",
    "dtype",
    "max_new_tokens",
)


def merge_results(results: Sequence[EvalResult]) -> EvalResult:
    """One result holding the samples of several runs of the same evaluation with different seeds.

    The runs must agree on everything but the seed (and their sample counts): model, draft, tasks,
    lengths, keep rates, methods, generation, dtype and answer length. Sample and record ids get the
    run's seed appended (``niah_single/1024/0@seed1``) so that they stay unique; the summary is then
    the mean over every sample of every run.

    Raises:
        InvalidRequestError: no runs, runs that differ in a setting above, or two runs with one seed
            (the same samples twice).
    """
    results = list(results)
    if not results:
        raise InvalidRequestError("nothing to merge", param="merge")
    first = results[0].config
    for other in results[1:]:
        for name in _MERGE_FIELDS:
            if getattr(other.config, name) != getattr(first, name):
                raise InvalidRequestError(
                    f"cannot merge runs that differ in {name}: {getattr(first, name)!r} and "
                    f"{getattr(other.config, name)!r}",
                    param="merge",
                )
    sources = [
        src
        for r in results
        for src in r.sources
        or [{"seed": r.config.seed, "samples": r.config.samples, "command": r.command, "elapsed_s": r.elapsed_s}]
    ]
    seeds = [src["seed"] for src in sources]
    if len(set(seeds)) != len(seeds):
        raise InvalidRequestError(f"runs share a seed ({seeds}): they hold the same samples", param="merge")
    merged = EvalResult(
        config=EvalConfig(**{**asdict(first), "samples": sum(int(src["samples"]) for src in sources)}),
        environment=results[0].environment,
        started=min(r.started for r in results),
        elapsed_s=sum(r.elapsed_s for r in results),
        sources=sources,
    )
    for r in results:

        def tag(item: dict[str, Any], run: EvalResult = r) -> dict[str, Any]:
            if run.sources or "id" not in item:  # the output of a merge already carries its tags
                return dict(item)
            return {**item, "id": f"{item['id']}@seed{run.config.seed}"}

        merged.records.extend(tag(x) for x in r.records)
        merged.samples.extend(tag(x) for x in r.samples)
        merged.errors.extend(r.errors)
    return merged


def _rate_key(value: Any) -> RateKey:
    return POLICY if value == POLICY else float(value)


def _rate_text(rate: RateKey) -> str:
    return rate if isinstance(rate, str) else f"{rate:g}"


def _rates(method: Method, config: EvalConfig) -> tuple[RateKey, ...]:
    """The rates ``method`` runs at: every keep rate, or once (`POLICY`) for a policy that decides its share."""
    return (POLICY,) if method.policy is not None else config.keep_rates


def _mean(values: Sequence[float]) -> float:
    return float(sum(values) / len(values)) if values else float("nan")


def _environment(target: LoadedModel, draft: LoadedModel) -> dict[str, Any]:
    import os

    import transformers

    env: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": str(target.device),
        "dtype": str(target.dtype).removeprefix("torch."),
        "target": {"name": target.name, "source": target.source},
        "draft": {"name": draft.name, "source": draft.source},
        "torch_threads": torch.get_num_threads(),
    }
    if target.device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(target.device)
    with contextlib.suppress(OSError):
        env["load_average"] = [round(x, 2) for x in os.getloadavg()]
    return env


@dataclass
class _Case:
    sample: EvalSample
    prompt: Prompt
    evidence: list[bool]
    context: tuple[int, int]  # characters of prompt.text that hold the task's context (before the question)


def _build_case(tokenizer: Any, sample: EvalSample) -> _Case:
    use_chat = getattr(tokenizer, "chat_template", None) is not None
    if use_chat:
        prompt = build_prompt(tokenizer, [{"role": "user", "content": sample.text}])
    else:
        prompt = build_prompt(tokenizer, sample.text)
    offset = prompt.text.find(sample.text)
    if offset < 0:
        raise InvalidRequestError("the chat template changed the task text; cannot locate its evidence")
    question = token_mask_for_spans(prompt, [sample.question_span], offset=offset)
    prompt = prompt.with_protected(question)
    evidence = token_mask_for_spans(prompt, sample.evidence, offset=offset)
    return _Case(sample, prompt, evidence, (offset, offset + sample.question_span[0]))


def _judge(output: str, sample: EvalSample) -> tuple[bool, bool]:
    return (contains_match(output, sample.answers, sample.match), exact_match(output, sample.answers, sample.match))


ProgressCallback = Callable[[str], None]


def run_eval(
    config: EvalConfig,
    *,
    progress: bool = True,
    target: LoadedModel | None = None,
    draft: LoadedModel | None = None,
    on_sample: Callable[[EvalResult], None] | None = None,
) -> EvalResult:
    """Run ``config``; already loaded ``target`` / ``draft`` models may be passed in.

    ``on_sample`` is called with the result so far after each sample (its ``elapsed_s`` updated), so
    that a long run can save what it has (the CLI writes ``<name>.partial.json``).

    Deterministic for a given config: samples come from ``config.seed``, decoding is greedy and the
    random baseline is seeded.

    Raises:
        InvalidRequestError: an invalid configuration.
        ModelLoadError: a model that cannot be loaded.
    """
    config.validate()
    torch.manual_seed(config.seed)
    t_start = time.perf_counter()
    result = EvalResult(config=config, started=datetime.now(timezone.utc).isoformat(timespec="seconds"))
    if target is None:
        target = load_model(config.model, device=config.device, dtype=config.dtype, progress=progress)
    if draft is None:
        draft = (
            target
            if config.draft in (None, config.model)
            else load_model(config.draft or config.model, device=config.device, dtype=config.dtype, progress=progress)
        )
    result.environment = _environment(target, draft)
    tokenizer = target.tokenizer
    methods = build_methods(config.methods, draft=draft, seed=config.seed, target_tokenizer=tokenizer, target=target)
    lingua: Any = None
    if "llmlingua" in config.methods:
        try:
            from .lingua import LLMLinguaSelector

            lingua = LLMLinguaSelector(draft)
        except Exception as exc:  # the comparison package is optional; say why it did not run
            logger.warning("llmlingua cannot run: %s", exc)
            result.errors.append({"method": "llmlingua", "error": f"{type(exc).__name__}: {exc}"})
            methods = [m for m in methods if m.name != "llmlingua"]
    backend = None
    if config.generate:
        from ..backends import TransformersBackend

        backend = TransformersBackend(target)

    samples = _make_samples(config, tokenizer, target.max_context)
    result.samples = [s.to_dict() for s in samples]
    answers_dense = config.generate and config.dense
    per_sample = sum(len(_rates(m, config)) for m in methods) + (1 if answers_dense else 0)
    with _progress(progress) as bar:
        task_id = bar.add_task("evaluating", total=len(samples) * per_sample)
        for sample in samples:
            case = _build_case(tokenizer, sample)
            bar.update(task_id, description=f"{sample.sample_id} ({case.prompt.n} tokens)")
            base = {
                "id": sample.sample_id,
                "task": sample.task,
                "length": sample.length,
                "n": case.prompt.n,
                "evidence_tokens": sum(case.evidence),
            }
            if backend is not None and answers_dense:
                result.records.append(
                    _generate(backend, config, case, base, FULL, 1.0, Selection.keep_all(case.prompt.n), 0.0, None)
                )
                bar.advance(task_id)
            scores: dict[str, tuple[TokenScores, float] | Exception] = {}
            for method in methods:
                for rate in _rates(method, config):
                    try:
                        selection, score_ms, select_ms = _select(method, case, rate, scores, lingua)
                    except Exception as exc:
                        logger.warning(
                            "%s failed on %s at %s: %s", method.name, sample.sample_id, _rate_text(rate), exc
                        )
                        result.errors.append(
                            {
                                "method": method.name,
                                "sample": sample.sample_id,
                                "rate": _rate_text(rate),
                                "error": f"{type(exc).__name__}: {exc}",
                            }
                        )
                        bar.advance(task_id)
                        continue
                    if backend is not None:
                        record = _generate(
                            backend, config, case, base, method.name, rate, selection, score_ms, select_ms
                        )
                    else:
                        record = _record(case, base, method.name, rate, selection, score_ms, select_ms)
                    result.records.append(record)
                    bar.advance(task_id)
            if on_sample is not None:
                result.elapsed_s = time.perf_counter() - t_start
                on_sample(result)
    result.elapsed_s = time.perf_counter() - t_start
    return result


def _make_samples(config: EvalConfig, tokenizer: Any, max_context: int) -> list[EvalSample]:
    samples: list[EvalSample] = []
    for task in config.tasks:
        for length in config.lengths:
            fit = min(length, max_context - _ANSWER_ROOM)
            if fit < length:
                logger.info("%s: length %d sized to %d tokens to leave room for the answer", task, length, fit)
            for s in generate_samples(task, tokenizer, length=fit, count=config.samples, seed=config.seed):
                samples.append(_relabel(s, length) if fit != length else s)
    return samples


def _relabel(sample: EvalSample, length: int) -> EvalSample:
    from dataclasses import replace

    return replace(sample, length=length, info={**sample.info, "sized_to": sample.length})


def _select(
    method: Method, case: _Case, rate: RateKey, scores: dict[str, tuple[TokenScores, float] | Exception], lingua: Any
) -> tuple[Selection, float | None, float]:
    prompt = case.prompt
    if isinstance(rate, str):  # a policy's selector decides the share and takes no rate
        assert method.scorer is not None and method.policy is not None
        selector = method.selector(1.0)
        if selector.decide_without_scores(prompt) is not None:
            # Prefilled whole without the draft, as users get it: no scoring pass to time.
            (comp,) = compress_prompts([prompt], method.scorer, selector, fallback_on_scorer_error=False)
            return comp.selection, None, comp.select_ms
        rate = 1.0
    if method.scorer is None:  # llmlingua selects by itself
        from ..selection import Protect

        protect = method.selector(rate)
        assert isinstance(protect, Protect)
        t0 = time.perf_counter()
        selection = lingua.select(prompt, context=case.context, rate=rate, forced=protect.mask(prompt))
        return selection, None, (time.perf_counter() - t0) * 1000
    cached = scores.get(method.scorer_key)
    if cached is None:
        t0 = time.perf_counter()
        try:
            cached = (method.scorer.score(prompt), (time.perf_counter() - t0) * 1000)
        except Exception as exc:
            cached = exc
        scores[method.scorer_key] = cached
    if isinstance(cached, Exception):
        raise cached
    token_scores, score_ms = cached
    # Scored once per sample for every rate: the compress step selects from these scores, and a scorer
    # error is the method's error at every rate (no dense fallback in an evaluation).
    (comp,) = compress_prompts(
        [prompt], method.scorer, method.selector(rate), fallback_on_scorer_error=False, score=lambda _: [token_scores]
    )
    return comp.selection, score_ms, comp.select_ms


def _record(
    case: _Case,
    base: dict[str, Any],
    method: str,
    rate: RateKey,
    selection: Selection,
    score_ms: float | None,
    select_ms: float | None,
) -> dict[str, Any]:
    return {
        **base,
        "method": method,
        "keep_rate": rate,
        "kept": selection.kept,
        "keep_ratio": round(selection.keep_ratio, 4),
        "recall": round(evidence_recall(selection, case.evidence), 4),
        "score_ms": None if score_ms is None else round(score_ms, 1),
        "select_ms": None if select_ms is None else round(select_ms, 2),
    }


def _generate(
    backend: Any,
    config: EvalConfig,
    case: _Case,
    base: dict[str, Any],
    method: str,
    rate: RateKey,
    selection: Selection,
    score_ms: float | None,
    select_ms: float | None,
) -> dict[str, Any]:
    record = _record(case, base, method, rate, selection, score_ms, select_ms)
    max_new = config.max_new_tokens or case.sample.max_new_tokens
    params = SamplingParams(max_tokens=max_new, temperature=0.0)
    t0 = time.perf_counter()
    completion = backend.generate(CompressedPrompt.from_selection(case.prompt, selection), params)
    contains, exact = _judge(completion.text, case.sample)
    record.update(
        {
            "output": completion.text,
            "contains": contains,
            "exact": exact,
            "prefill_ms": round(completion.timings.prefill, 1),
            "generate_ms": round((time.perf_counter() - t0) * 1000, 1),
        }
    )
    return record


def _progress(enabled: bool) -> Any:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        disable=not enabled,
        transient=False,
    )
