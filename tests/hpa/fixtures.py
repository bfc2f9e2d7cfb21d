"""A STAND-IN external metrics API (not Zeroscale's adapter) on the Kubernetes API stand-in, for the hpa tests."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from tests.fixtures.kube_standin import KubeStandIn, Reply, StandInRequest, status_body

EXTERNAL_METRICS = r"/apis/external\.metrics\.k8s\.io/v1beta1/namespaces/([^/]+)/([^/]+)"


@dataclass
class MetricsStandIn:
    """Serves an ExternalMetricValueList (docs/protocols.md#em-response) for `values[name]`, or a Status
    (docs/protocols.md#em-errors) for `errors[name]`.

    It runs on the Kubernetes API stand-in, so the same server also answers scale, pods and
    HPA reads when a test adds them (the `--kubeconfig` path). `calls` records (namespace,
    metric path segment, labelSelector or None) of every list call.
    """

    kube: KubeStandIn
    values: dict[str, list[str]] = field(default_factory=dict)
    errors: dict[str, tuple[int, str, str]] = field(default_factory=dict)
    calls: list[tuple[str, str, str | None]] = field(default_factory=list)

    def handle(self, request: StandInRequest, match: re.Match[str]) -> Reply:
        namespace, metric = match.group(1), match.group(2)
        self.calls.append((namespace, metric, request.param("labelSelector")))
        if metric in self.errors:
            code, reason, message = self.errors[metric]
            return Reply(code, status_body(code, reason, message))
        if metric not in self.values:
            message = f"the server could not find the metric {metric} for namespaces"
            return Reply(404, status_body(404, "NotFound", message))
        items: list[dict[str, Any]] = [
            {"metricName": metric, "metricLabels": {}, "timestamp": "2026-11-30T04:00:00Z", "value": value}
            for value in self.values[metric]
        ]
        body = {
            "kind": "ExternalMetricValueList",
            "apiVersion": "external.metrics.k8s.io/v1beta1",
            "metadata": {},
            "items": items,
        }
        return Reply(200, body)
