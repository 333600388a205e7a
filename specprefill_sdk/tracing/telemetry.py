"""OpenTelemetry spans and metrics for the pipeline, through ``opentelemetry-api`` only.

The SDK never configures OpenTelemetry. Pass ``tracer_provider``/``meter_provider`` to a `Pipeline`
(or configure the global ones in your application); without an SDK the API's no-op providers make
every call here free. `specprefill_sdk.tracing.setup.configure` builds exporting providers for the
command line and the server.

Spans: ``specprefill.pipeline`` (root) with ``specprefill.score``, ``specprefill.select`` and the
inference span named ``"{gen_ai.operation.name} {gen_ai.request.model}"`` per the GenAI semantic
conventions.

Metrics: ``specprefill.ttft``, ``specprefill.score.duration`` and ``specprefill.keep_ratio``
(histograms), ``specprefill.prompt_tokens``, ``specprefill.kept_tokens`` and
``specprefill.fallbacks`` (counters), plus the GenAI client metrics
``gen_ai.client.operation.duration``, ``gen_ai.client.token.usage`` and, for streaming calls,
``gen_ai.client.operation.time_to_first_chunk``.

Example::

    from opentelemetry.sdk.trace import TracerProvider
    pipe = Pipeline(scorer, selector, backend, tracer_provider=TracerProvider())
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import metrics, trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

__all__ = ["Telemetry", "error_type", "mark_cancelled", "record_error", "set_attributes"]

_SCOPE = "specprefill_sdk"

# Bucket boundaries recommended by the GenAI semantic conventions.
_DURATION_BUCKETS_S = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)
_TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864)
_TTFC_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
# The default histogram buckets (0, 5, 10, ...) would put every keep ratio into one bucket.
_RATIO_BUCKETS = (0.02, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)
_MS_BUCKETS = (1, 2, 5, 10, 25, 50, 75, 100, 250, 500, 750, 1000, 2500, 5000, 10000, 30000, 60000)


class Telemetry:
    """The tracer and the metric instruments of one pipeline.

    Example::

        tel = Telemetry(tracer_provider, meter_provider)
        with tel.span("specprefill.score", {"specprefill.scorer": "draft-attention"}):
            ...
    """

    def __init__(self, tracer_provider: Any = None, meter_provider: Any = None) -> None:
        from .. import __version__

        self.tracer = (tracer_provider or trace.get_tracer_provider()).get_tracer(_SCOPE, __version__)
        meter = (meter_provider or metrics.get_meter_provider()).get_meter(_SCOPE, __version__)
        self.ttft = meter.create_histogram(
            "specprefill.ttft",
            unit="ms",
            description="time to first token",
            explicit_bucket_boundaries_advisory=_MS_BUCKETS,
        )
        self.score_time = meter.create_histogram(
            "specprefill.score.duration",
            unit="ms",
            description="draft scoring time",
            explicit_bucket_boundaries_advisory=_MS_BUCKETS,
        )
        self.keep_ratio = meter.create_histogram(
            "specprefill.keep_ratio",
            unit="1",
            description="kept tokens / prompt tokens",
            explicit_bucket_boundaries_advisory=_RATIO_BUCKETS,
        )
        self.prompt_tokens = meter.create_counter(
            "specprefill.prompt_tokens", unit="{token}", description="original prompt tokens"
        )
        self.kept_tokens = meter.create_counter(
            "specprefill.kept_tokens", unit="{token}", description="prompt tokens prefilled by the target"
        )
        self.fallbacks = meter.create_counter(
            "specprefill.fallbacks", unit="{fallback}", description="requests that fell back to dense prefill"
        )
        # GenAI semantic-convention client metrics, so generic GenAI dashboards work unchanged.
        self.operation_duration = meter.create_histogram(
            "gen_ai.client.operation.duration",
            unit="s",
            description="GenAI operation duration.",
            explicit_bucket_boundaries_advisory=_DURATION_BUCKETS_S,
        )
        self.token_usage = meter.create_histogram(
            "gen_ai.client.token.usage",
            unit="{token}",
            description="Number of input and output tokens used.",
            explicit_bucket_boundaries_advisory=_TOKEN_BUCKETS,
        )
        self.time_to_first_chunk = meter.create_histogram(
            "gen_ai.client.operation.time_to_first_chunk",
            unit="s",
            description="Time to receive the first chunk of a streamed response.",
            explicit_bucket_boundaries_advisory=_TTFC_BUCKETS_S,
        )

    @contextlib.contextmanager
    def span(
        self, name: str, attributes: Mapping[str, Any] | None = None, kind: SpanKind = SpanKind.INTERNAL
    ) -> Iterator[Span]:
        """A current span that records an escaping exception with ``error.type`` and an error status.

        A generator closed by its consumer (``GeneratorExit``) is a cancellation, not an error: the
        span gets ``specprefill.cancelled = true`` and no error status.
        """
        span = self.tracer.start_span(name, kind=kind, attributes=_clean(attributes))
        if not span.is_recording() and span.get_span_context() == trace.get_current_span().get_span_context():
            # The API's no-op span (no SDK configured) carries the current context unchanged: there is
            # nothing to record and nothing to attach, which keeps the no-SDK path cheap.
            yield span
            return
        token = otel_context.attach(trace.set_span_in_context(span))
        try:
            yield span
        except GeneratorExit:
            mark_cancelled(span)
            raise
        except BaseException as exc:
            record_error(span, exc)
            raise
        finally:
            otel_context.detach(token)
            span.end()

    def start_span(
        self,
        name: str,
        attributes: Mapping[str, Any] | None = None,
        *,
        kind: SpanKind = SpanKind.INTERNAL,
        context: Context | None = None,
    ) -> Span:
        """Start a span without making it current; end it with ``span.end()``.

        For generators: a span held across ``yield`` must not stay attached to the caller's context,
        so the generator activates it (`activate`) only around its own work.
        """
        return self.tracer.start_span(name, context=context, kind=kind, attributes=_clean(attributes))

    @staticmethod
    @contextlib.contextmanager
    def activate(span: Span) -> Iterator[Span]:
        """Make ``span`` current inside the block; never ends it and records nothing on exceptions."""
        with trace.use_span(span, end_on_exit=False, record_exception=False, set_status_on_exception=False):
            yield span


def _clean(attributes: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if not attributes:
        return None
    return {k: v for k, v in attributes.items() if v is not None}


def set_attributes(span: Span, attributes: Mapping[str, Any]) -> None:
    """Set the non-None attributes on a recording span."""
    if span.is_recording():
        span.set_attributes(_clean(attributes) or {})


def error_type(exc: BaseException) -> str:
    """The ``error.type`` of an exception: its class name (``BackendUnavailableError``)."""
    return type(exc).__qualname__


def record_error(span: Span, exc: BaseException) -> None:
    """Record ``exc`` on ``span``: ``error.type``, an ``exception`` event and an error status."""
    if span.is_recording():
        span.set_attribute("error.type", error_type(exc))
        span.record_exception(exc)
        span.set_status(Status(StatusCode.ERROR, f"{error_type(exc)}: {exc}"))


def mark_cancelled(span: Span) -> None:
    """Mark a span whose work the caller stopped early (a stream closed before its end)."""
    if span.is_recording():
        span.set_attribute("specprefill.cancelled", True)
