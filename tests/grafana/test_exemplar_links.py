"""A click on an exemplar opens its trace: the provisioned Prometheus data source sends the exemplar label our
histograms carry the trace id in to a provisioned Jaeger data source. (That Prometheus returns those exemplars for the
panels' own queries: tests/proxy/test_exemplars.py.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from opentelemetry.sdk.trace import TracerProvider

from adapter.telemetry import tracing

DATASOURCES = Path(__file__).resolve().parents[2] / "grafana/provisioning/datasources/prometheus.yaml"


def test_the_prometheus_data_source_links_trace_ids_to_jaeger() -> None:
    provisioned: list[dict[str, Any]] = yaml.safe_load(DATASOURCES.read_text())["datasources"]
    prometheus = next(source for source in provisioned if source["type"] == "prometheus")
    (destination,) = prometheus["jsonData"]["exemplarTraceIdDestinations"]
    with TracerProvider().get_tracer("t").start_as_current_span("sampled") as span:
        exemplar = tracing.exemplar_of(span)
    assert exemplar is not None
    assert destination["name"] in exemplar  # the label holding the trace id
    assert exemplar[destination["name"]] == f"{span.get_span_context().trace_id:032x}"
    (jaeger,) = [source for source in provisioned if source.get("uid") == destination["datasourceUid"]]
    assert (jaeger["type"], jaeger["name"]) == ("jaeger", "jaeger")
