"""Exporting OpenTelemetry providers for the command line and the server: ``none``, ``console`` or ``otlp``.

The library itself only speaks ``opentelemetry-api`` and never configures an SDK (see
`specprefill_sdk.tracing`). Entry points that want to export (``specprefill run --otel console``,
``specprefill serve --otel otlp``) call `configure`, which needs the optional extra::

    pip install 'specprefill-sdk[otel]'

``otlp`` exports over OTLP/HTTP (protobuf) and is configured only by the standard ``OTEL_*``
variables: ``OTEL_EXPORTER_OTLP_ENDPOINT`` (default ``http://localhost:4318``), the per-signal
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``/``..._METRICS_ENDPOINT``, ``OTEL_EXPORTER_OTLP_HEADERS``,
``OTEL_EXPORTER_OTLP_TIMEOUT``, ``OTEL_EXPORTER_OTLP_COMPRESSION``, ``OTEL_SERVICE_NAME``,
``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_SAMPLER``, ``OTEL_BSP_*``, ``OTEL_METRIC_EXPORT_INTERVAL``;
``OTEL_TRACES_EXPORTER=none`` / ``OTEL_METRICS_EXPORTER=none`` switch one signal off and
``OTEL_SDK_DISABLED=true`` switches both off.

Example::

    tracer_provider, meter_provider = configure("console")
    pipe = load_pipeline("paper", tracer_provider=tracer_provider, meter_provider=meter_provider)
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any, TextIO

from opentelemetry import metrics, trace

from ..errors import InvalidRequestError, SpecPrefillError

__all__ = ["KINDS", "configure"]

logger = logging.getLogger(__name__)

#: The accepted values of ``--otel``.
KINDS = ("none", "console", "otlp")

_DEFAULT_SERVICE_NAME = "specprefill"
_INSTALL = "pip install 'specprefill-sdk[otel]'"


def configure(
    kind: str,
    *,
    set_global: bool = False,
    service_name: str | None = None,
    out: TextIO | None = None,
) -> tuple[trace.TracerProvider, metrics.MeterProvider]:
    """Build a tracer provider and a meter provider that export to ``kind``.

    ``none`` gives the API's no-op providers (nothing is recorded, no SDK needed). ``console``
    prints every finished span as JSON and the metrics at each export interval and at exit, to
    ``out`` (standard error by default, so that standard output keeps only the answer). ``otlp``
    sends both signals to an OTLP/HTTP collector configured by the ``OTEL_*`` variables. The SDK
    providers flush at interpreter exit; call their ``shutdown()`` to flush earlier.

    With ``set_global=True`` the providers also become OpenTelemetry's global ones (once per
    process), so other instrumentation in the process exports through them too. The service name
    comes from ``OTEL_SERVICE_NAME`` / ``OTEL_RESOURCE_ATTRIBUTES`` when they set one, else from
    ``service_name``, else it is ``specprefill``.

    Raises:
        InvalidRequestError: ``kind`` is not one of `KINDS`, or OTLP is asked for another protocol
            than ``http/protobuf``.
        SpecPrefillError: the ``otel`` extra (``opentelemetry-sdk``, and for ``otlp``
            ``opentelemetry-exporter-otlp-proto-http``) is not installed.

    Example::

        tracer_provider, meter_provider = configure("otlp")  # OTEL_EXPORTER_OTLP_ENDPOINT=...
    """
    if kind not in KINDS:
        raise InvalidRequestError(
            f"unknown OpenTelemetry exporter {kind!r}; choose one of {', '.join(KINDS)}", param="otel"
        )
    if kind == "none" or _env_true("OTEL_SDK_DISABLED"):
        if kind != "none":
            logger.info("OTEL_SDK_DISABLED is set: recording no telemetry")
        return trace.NoOpTracerProvider(), metrics.NoOpMeterProvider()
    if kind == "otlp":
        protocol = os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf").strip() or "http/protobuf"
        if protocol != "http/protobuf":
            raise InvalidRequestError(
                f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r} is not supported; OTLP is exported over "
                "'http/protobuf' (port 4318 by default)",
                param="otel",
            )

    sdk = _import_sdk(kind)
    resource = sdk["Resource"].create(_resource_attributes(service_name))
    tracer_provider = sdk["TracerProvider"](resource=resource)
    readers: list[Any] = []
    stream = out if out is not None else sys.stderr
    if not _signal_off("OTEL_TRACES_EXPORTER"):
        if kind == "console":
            # One span printed as it ends: a short CLI run shows its trace without waiting for a batch.
            tracer_provider.add_span_processor(sdk["SimpleSpanProcessor"](sdk["ConsoleSpanExporter"](out=stream)))
        else:
            tracer_provider.add_span_processor(sdk["BatchSpanProcessor"](sdk["OTLPSpanExporter"]()))
    if not _signal_off("OTEL_METRICS_EXPORTER"):
        exporter = sdk["ConsoleMetricExporter"](out=stream) if kind == "console" else sdk["OTLPMetricExporter"]()
        readers.append(sdk["PeriodicExportingMetricReader"](exporter))
    meter_provider = sdk["MeterProvider"](resource=resource, metric_readers=readers)
    if set_global:
        trace.set_tracer_provider(tracer_provider)
        metrics.set_meter_provider(meter_provider)
    logger.info(
        "OpenTelemetry: exporting traces and metrics to %s as service %r", kind, resource.attributes.get("service.name")
    )
    return tracer_provider, meter_provider


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() == "true"


def _signal_off(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() == "none"


def _resource_attributes(service_name: str | None) -> dict[str, str]:
    from .. import __version__

    # Explicit resource attributes override the environment's, so these are defaults that only fill
    # what OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES leave open.
    given = {
        part.split("=", 1)[0].strip()
        for part in os.environ.get("OTEL_RESOURCE_ATTRIBUTES", "").split(",")
        if "=" in part
    }
    if os.environ.get("OTEL_SERVICE_NAME", "").strip():
        given.add("service.name")
    defaults = {"service.name": service_name or _DEFAULT_SERVICE_NAME, "service.version": __version__}
    return {k: v for k, v in defaults.items() if k not in given}


def _import_sdk(kind: str) -> dict[str, Any]:
    try:
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import ConsoleMetricExporter, PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SimpleSpanProcessor
    except ImportError as exc:
        raise SpecPrefillError(
            f"exporting OpenTelemetry data ({kind}) needs the OpenTelemetry SDK, which is not installed "
            f"(missing module {exc.name!r}); install it with: {_INSTALL}"
        ) from exc
    names: dict[str, Any] = {
        "MeterProvider": MeterProvider,
        "ConsoleMetricExporter": ConsoleMetricExporter,
        "PeriodicExportingMetricReader": PeriodicExportingMetricReader,
        "Resource": Resource,
        "TracerProvider": TracerProvider,
        "BatchSpanProcessor": BatchSpanProcessor,
        "ConsoleSpanExporter": ConsoleSpanExporter,
        "SimpleSpanProcessor": SimpleSpanProcessor,
    }
    if kind == "otlp":
        try:
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError as exc:
            raise SpecPrefillError(
                "exporting OpenTelemetry data over OTLP needs the OTLP/HTTP exporter, which is not installed "
                f"(missing module {exc.name!r}); install it with: {_INSTALL}"
            ) from exc
        names["OTLPSpanExporter"] = OTLPSpanExporter
        names["OTLPMetricExporter"] = OTLPMetricExporter
    return names
