"""The JSON documents of the external metrics API, shaped as docs/protocols.md#em-discovery,
docs/protocols.md#em-response and docs/protocols.md#em-errors show."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from typing import Any

GROUP = "external.metrics.k8s.io"
VERSION = "v1beta1"
GROUP_VERSION = f"{GROUP}/{VERSION}"

_VERSION_ENTRY = {"groupVersion": GROUP_VERSION, "version": VERSION}
_API_GROUP = {"name": GROUP, "versions": [_VERSION_ENTRY], "preferredVersion": _VERSION_ENTRY}


def encode(document: Mapping[str, Any]) -> bytes:
    """Compact JSON, as Go's encoder writes it."""
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode()


API_GROUP_LIST = encode({"kind": "APIGroupList", "apiVersion": "v1", "groups": [_API_GROUP]})
API_GROUP = encode({"kind": "APIGroup", "apiVersion": "v1", **_API_GROUP})


def api_resource_list(metric_names: Iterable[str]) -> bytes:
    resources = [
        {"name": name, "singularName": "", "namespaced": True, "kind": "ExternalMetricValueList", "verbs": ["get"]}
        for name in metric_names
    ]
    return encode(
        {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": GROUP_VERSION, "resources": resources}
    )


def rfc3339(timestamp: float) -> str:
    """metav1.Time: UTC, whole seconds."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(timestamp))


def external_metric_value_list(name: str, labels: Mapping[str, str], timestamp: float, quantity: str) -> bytes:
    """One item, never an empty list: the HPA treats an empty list as an error (docs/protocols.md#em-response)."""
    item = {"metricName": name, "metricLabels": dict(labels), "timestamp": rfc3339(timestamp), "value": quantity}
    return encode({"kind": "ExternalMetricValueList", "apiVersion": GROUP_VERSION, "metadata": {}, "items": [item]})


def status(code: int, reason: str, message: str, details: Mapping[str, Any] | None = None) -> bytes:
    """A metav1.Status failure (docs/protocols.md#em-errors)."""
    document: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
    }
    if details:
        document["details"] = dict(details)
    document["code"] = code
    return encode(document)
