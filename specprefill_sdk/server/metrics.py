"""Prometheus metrics of the server: `ServerMetrics`, served at ``GET /metrics`` with ``ServerConfig.metrics``.

The latency, token and request metrics carry vLLM's names, units, label (``model_name``) and bucket
boundaries (``vllm/v1/metrics/loggers.py``), so that dashboards and alerts written for a vLLM server
read this one unchanged: reusing the ``vllm:`` prefix from a server that is not vLLM is a deliberate
compatibility choice. What only speculative prefill has (the draft's scoring, the kept share, the
fallbacks) is under ``specprefill:``. docs/server.md lists every name with its unit and meaning.

Each app has its own `CollectorRegistry` (never the process-global one), so several apps in one
process keep apart. Gauges (running, waiting, stored conversations) and the admission refusals are
read from the engine's objects when scraped, not kept in step by hand.

Example::

    metrics = ServerMetrics("smollm2-135m", admission, conversations, max_model_len=8192)
    metrics.finished(completion, e2e_s=0.8, queued_s=0.1)
    text = metrics.exposition()
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ..cost import SLOWER_THAN_DENSE
from ..types import Completion

if TYPE_CHECKING:
    from .limits import Admission
    from .sessions import ConversationStore

__all__ = [
    "CONTENT_TYPE",
    "FALLBACK_REASONS",
    "FINISHED_REASONS",
    "ServerMetrics",
    "fallback_reason",
    "token_buckets",
]

#: The exposition's media type: Prometheus' text format 0.0.4, which every Prometheus reads.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

#: ``specprefill:fallbacks_total``'s reasons: the draft failed, the prompt was shorter than the
#: policy's ``dense_below_tokens``, the request turned compression off (``specprefill.enabled``), or
#: the measured costs said scoring would not beat a dense prefill (``Pipeline.dense_when_slower``).
FALLBACK_REASONS = ("scorer_error", "dense_below", "disabled", SLOWER_THAN_DENSE)
#: ``vllm:request_success_total``'s ``finished_reason`` values: a stop (EOS or a stop string), the
#: ``max_tokens`` limit, or a stream stopped before its end (vLLM's ``abort``): the client left, or the
#: generation failed mid-stream.
FINISHED_REASONS = ("stop", "length", "abort")

# vLLM's bucket boundaries, copied so that histogram_quantile over both servers compares like with like.
_TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
_TOKEN_LATENCY_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
_REQUEST_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
# Ours: selection is milliseconds of CPU work; the kept share lies in (0, 1], paper policies near 0.1.
_SELECT_BUCKETS = (0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
_KEPT_RATIO_BUCKETS = (0.02, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.99, 1.0)

_LABELS = ("model_name",)


def token_buckets(max_value: int) -> list[float]:
    """vLLM's 1-2-5 buckets for token counts, up to ``max_value``: 1, 2, 5, 10, 20, 50, ...

    Example::

        token_buckets(100)  # [1, 2, 5, 10, 20, 50, 100]
    """
    buckets: list[float] = []
    scale = 1
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * scale
            if value > max_value:
                return buckets
            buckets.append(float(value))
        scale *= 10


def fallback_reason(completion: Completion, *, disabled: bool = False) -> str | None:
    """Why a request was prefilled whole instead of compressed (one of `FALLBACK_REASONS`), or None.

    ``disabled``: the request turned compression off. A policy that keeps everything by its own rate
    (``dense``) is no fallback: it compressed as asked.
    """
    if disabled:
        return "disabled"
    if completion.fallback is not None and completion.fallback.startswith("scorer_error"):
        return "scorer_error"
    if completion.fallback is not None and completion.fallback.startswith(SLOWER_THAN_DENSE):
        return SLOWER_THAN_DENSE
    selection = completion.selection
    # `DenseBelow` ("dense below N tokens") and `Adaptive` ("adaptive: dense below N tokens") say so
    # in the reason of the dense selection they decide without scores; the selection has no other mark.
    if selection is not None and selection.dense and "dense below" in selection.reason:
        return "dense_below"
    return None


class ServerMetrics:
    """The server's Prometheus metrics in a registry of their own; `finished` records one request.

    Args:
        model_name: the served model's id, the ``model_name`` label of every metric.
        admission: the queue whose running and waiting requests and refusals are read when scraped.
        conversations: the store whose kept conversations are counted when scraped.
        max_model_len: the model's context, the top of the token-count buckets.
    """

    def __init__(
        self,
        model_name: str,
        admission: Admission,
        conversations: ConversationStore,
        *,
        max_model_len: int,
        strategies: Sequence[str] = (),
    ) -> None:
        self.model_name = model_name
        self.registry = CollectorRegistry()
        self.registry.register(_EngineState(model_name, admission, conversations))
        labels = _LABELS

        def histogram(name: str, doc: str, buckets: Sequence[float]) -> Histogram:
            return Histogram(name, doc, labels, registry=self.registry, buckets=buckets).labels(model_name)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, labels, registry=self.registry).labels(model_name)

        self.ttft = histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds: from the request's arrival (queue included).",
            _TTFT_BUCKETS,
        )
        self.inter_token = histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds (each request's decode time spread over its tokens).",
            _TOKEN_LATENCY_BUCKETS,
        )
        self.request_tpot = histogram(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            _TOKEN_LATENCY_BUCKETS,
        )
        self.e2e = histogram(
            "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", _REQUEST_LATENCY_BUCKETS
        )
        self.queue_time = histogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            _REQUEST_LATENCY_BUCKETS,
        )
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed (the whole prompts).")
        self.generation_tokens = counter("vllm:generation_tokens", "Number of generation tokens processed.")
        token_counts = token_buckets(max_model_len)
        self.request_prompt_tokens = histogram(
            "vllm:request_prompt_tokens", "Number of prefill tokens processed.", token_counts
        )
        self.request_generation_tokens = histogram(
            "vllm:request_generation_tokens", "Number of generation tokens processed.", token_counts
        )
        success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            [*labels, "finished_reason"],
            registry=self.registry,
        )
        self.success = {reason: success.labels(model_name, reason) for reason in FINISHED_REASONS}

        self.score_time = histogram(
            "specprefill:score_time_seconds",
            "Seconds the draft model spent scoring a request's prompt (requests it scored).",
            _TTFT_BUCKETS,
        )
        self.select_time = histogram(
            "specprefill:selection_time_seconds",
            "Seconds the selector spent choosing a request's kept tokens.",
            _SELECT_BUCKETS,
        )
        self.kept_ratio = histogram(
            "specprefill:kept_ratio",
            "Kept tokens over prompt tokens, per request (1.0: prefilled whole).",
            _KEPT_RATIO_BUCKETS,
        )
        self.kept_tokens = counter("specprefill:kept_tokens", "Prompt tokens the target prefilled (kept).")
        fallbacks = Counter(
            "specprefill:fallbacks",
            "Requests prefilled whole instead of compressed, by reason.",
            [*labels, "reason"],
            registry=self.registry,
        )
        self.fallbacks = {reason: fallbacks.labels(model_name, reason) for reason in FALLBACK_REASONS}
        turns = Counter(
            "specprefill:conversation_turns",
            "Turns answered in conversations kept on the server, by strategy.",
            [*labels, "strategy"],
            registry=self.registry,
        )
        self._turns = turns
        for strategy in strategies:
            turns.labels(model_name, strategy)

    def finished(
        self,
        completion: Completion,
        *,
        e2e_s: float,
        queued_s: float,
        disabled: bool = False,
        strategy: str | None = None,
    ) -> None:
        """Record a request that finished with ``completion``.

        Args:
            completion: what the request answered (usage, timings, selection, fallback).
            e2e_s: seconds from its arrival to its end.
            queued_s: seconds it waited in the admission queue.
            disabled: the request turned compression off.
            strategy: the conversation's strategy, for a turn of a conversation kept on the server.
        """
        usage, timings = completion.usage, completion.timings
        total_s, ttft_s = timings.total / 1000.0, timings.ttft / 1000.0
        # `Timings` run from the start of the model work; before it came the queue and the tokenization.
        ahead_s = max(0.0, e2e_s - total_s)
        self.ttft.observe(ahead_s + ttft_s)
        self.e2e.observe(e2e_s)
        self.queue_time.observe(queued_s)
        intervals = usage.completion_tokens - 1
        if intervals > 0:
            per_token = max(0.0, total_s - ttft_s) / intervals
            self.request_tpot.observe(per_token)
            # Only the decode's total time is known, not each token's: every interval gets the mean,
            # so the histogram's _sum and _count are exact and its buckets show per-request means.
            for _ in range(intervals):
                self.inter_token.observe(per_token)
        self.prompt_tokens.inc(usage.prompt_tokens)
        self.generation_tokens.inc(usage.completion_tokens)
        self.request_prompt_tokens.observe(usage.prompt_tokens)
        self.request_generation_tokens.observe(usage.completion_tokens)
        self.success[completion.finish_reason].inc()
        self.kept_tokens.inc(usage.kept_tokens)
        self.kept_ratio.observe(usage.keep_ratio)
        if timings.score > 0:
            self.score_time.observe(timings.score / 1000.0)
        if completion.selection is not None:  # a pipeline selected (not a pre-compressed prompt)
            self.select_time.observe(timings.select / 1000.0)
        reason = fallback_reason(completion, disabled=disabled)
        if reason is not None:
            self.fallbacks[reason].inc()
        if strategy is not None:
            self._turns.labels(self.model_name, strategy).inc()

    def aborted(self, generated_tokens: int = 0) -> None:
        """Record a request stopped before its end (``finished_reason="abort"``): the client left, or it failed.

        ``generated_tokens`` were made before it stopped; they count among the generation tokens, as
        vLLM counts every token it decoded.
        """
        self.success["abort"].inc()
        if generated_tokens:
            self.generation_tokens.inc(generated_tokens)

    def exposition(self) -> bytes:
        """Every metric in Prometheus' text format (`CONTENT_TYPE`)."""
        return generate_latest(self.registry)


class _EngineState:
    """The metrics read from the engine's objects at each scrape: queue, refusals, conversations."""

    def __init__(self, model_name: str, admission: Admission, conversations: ConversationStore) -> None:
        self._model = model_name
        self._admission = admission
        self._conversations = conversations

    def collect(self) -> Iterable[Metric]:
        stats = self._admission.stats()
        labels = list(_LABELS)
        running = GaugeMetricFamily(
            "vllm:num_requests_running", "Number of requests in model execution batches.", labels=labels
        )
        running.add_metric([self._model], stats.running)
        waiting = GaugeMetricFamily(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed.", labels=labels
        )
        waiting.add_metric([self._model], stats.waiting)
        rejected = CounterMetricFamily(
            "specprefill:admission_rejected",
            "Requests refused with 429 because every worker was busy and the queue was full.",
            labels=labels,
        )
        rejected.add_metric([self._model], self._admission.rejected)
        kept = GaugeMetricFamily("specprefill:conversations", "Conversations kept on the server now.", labels=labels)
        kept.add_metric([self._model], len(self._conversations))
        return [running, waiting, rejected, kept]
