"""Traces (OpenTelemetry over OTLP/HTTP), for the proxy and the adapter alike: off unless turned on."""

from __future__ import annotations

from pydantic import Field

from adapter.config.base import Duration, Strict


class TracingConfig(Strict):
    """OpenTelemetry traces, sent over OTLP/HTTP (docs/how-to/tracing.md). The standard `OTEL_*` environment
    variables are honoured where a key here is left unset: `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (or
    `OTEL_EXPORTER_OTLP_ENDPOINT`), `OTEL_EXPORTER_OTLP_HEADERS`, `OTEL_EXPORTER_OTLP_CERTIFICATE`,
    `OTEL_TRACES_SAMPLER` and `OTEL_TRACES_SAMPLER_ARG`, `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`;
    `OTEL_SDK_DISABLED=true` keeps tracing off."""

    enabled: bool = False
    """Send traces. Off, the hot paths pay one test of a module attribute per request and nothing else."""
    endpoint: str = ""
    """The OTLP/HTTP traces URL (a Jaeger or a collector: `http://127.0.0.1:4318/v1/traces`); empty: from
    `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT`, else `http://localhost:4318/v1/traces`."""
    sample_ratio: float | None = Field(default=None, ge=0, le=1)
    """The share of new traces sampled (a request with no `traceparent`); a request whose caller sampled it (or not)
    follows its caller (parent-based). Unset: `OTEL_TRACES_SAMPLER`, else every trace (OpenTelemetry's default)."""
    service_name: str = Field(default="", max_length=255)
    """The `service.name` of the spans; empty: `OTEL_SERVICE_NAME`, else `zeroscale-proxy` or `zeroscale-adapter`."""
    max_queued_spans: int = Field(default=2048, ge=1)
    """Ended spans waiting to be exported; beyond it new spans are dropped (counted by
    `zeroscale_tracing_spans_total{outcome="dropped"}`): raise it, or lower `sample_ratio`."""
    export_timeout: Duration = Field(default=10.0, gt=0)
    """The deadline of one export to the endpoint; a batch that misses it is dropped and counted
    (`zeroscale_tracing_spans_total{outcome="failed"}`)."""
