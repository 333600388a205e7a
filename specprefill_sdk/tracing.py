"""OpenTelemetry spans and metrics for the pipeline, through ``opentelemetry-api`` only.

The SDK never configures OpenTelemetry. Pass ``tracer_provider``/``meter_provider`` to a `Pipeline`
(or configure the global ones in your application); without an SDK the API's no-op providers make
every call here free.

Spans: ``specprefill.pipeline`` (root) with ``specprefill.score``, ``specprefill.select`` and the
inference span named ``"{gen_ai.operation.name} {gen_ai.request.model}"`` per the GenAI semantic
conventions.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

__all__ = ["Telemetry"]

_SCOPE = "specprefill_sdk"


class Telemetry:
    """The tracer and the metric instruments of one pipeline."""

    def __init__(self, tracer_provider: Any = None, meter_provider: Any = None) -> None:
        from . import __version__

        self.tracer = (tracer_provider or trace.get_tracer_provider()).get_tracer(_SCOPE, __version__)
        meter = (meter_provider or metrics.get_meter_provider()).get_meter(_SCOPE, __version__)
        self.ttft = meter.create_histogram("specprefill.ttft", unit="ms", description="time to first token")
        self.score_time = meter.create_histogram("specprefill.score.duration", unit="ms",
                                                 description="draft scoring time")
        self.keep_ratio = meter.create_histogram("specprefill.keep_ratio", unit="1",
                                                 description="kept tokens / prompt tokens")
        self.prompt_tokens = meter.create_counter("specprefill.prompt_tokens", unit="{token}",
                                                  description="original prompt tokens")
        self.kept_tokens = meter.create_counter("specprefill.kept_tokens", unit="{token}",
                                                description="prompt tokens prefilled by the target")
        self.fallbacks = meter.create_counter("specprefill.fallbacks", unit="{fallback}",
                                              description="requests that fell back to dense prefill")

    @contextlib.contextmanager
    def span(self, name: str, attributes: Mapping[str, Any] | None = None,
             kind: SpanKind = SpanKind.INTERNAL) -> Iterator[Span]:
        """A span that records an escaping exception with ``error.type`` and an error status."""
        with self.tracer.start_as_current_span(name, kind=kind, attributes=_clean(attributes),
                                               record_exception=False, set_status_on_exception=False) as span:
            try:
                yield span
            except BaseException as exc:
                if span.is_recording():
                    span.set_attribute("error.type", type(exc).__qualname__)
                    span.record_exception(exc)
                    span.set_status(Status(StatusCode.ERROR, str(exc)))
                raise


def _clean(attributes: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if not attributes:
        return None
    return {k: v for k, v in attributes.items() if v is not None}


def set_attributes(span: Span, attributes: Mapping[str, Any]) -> None:
    """Set the non-None attributes on a recording span."""
    if span.is_recording():
        span.set_attributes(_clean(attributes) or {})
