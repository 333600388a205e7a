"""OpenTelemetry for the SDK: the telemetry object, the pipeline's spans and metrics, the SDK set-up.

The library speaks ``opentelemetry-api`` only (`Telemetry`, `StageTrace`); `specprefill_sdk.tracing.setup`
configures exporting providers for the command line and the server and needs the ``otel`` extra.
See `specprefill_sdk.tracing.telemetry` for the spans and metrics recorded.
"""

from __future__ import annotations

from .stages import Finish, Inference, StageTrace, draft_name
from .telemetry import Telemetry, error_type, mark_cancelled, record_error, set_attributes

__all__ = [
    "Finish",
    "Inference",
    "StageTrace",
    "Telemetry",
    "draft_name",
    "error_type",
    "mark_cancelled",
    "record_error",
    "set_attributes",
]
