"""What the HPA controller reads before a sync, read the same way (docs/protocols.md#em-list-call,
docs/protocols.md#em-response, docs/protocols.md#hpa-calls, docs/protocols.md#scale-subresource).

External metrics come from an adapter directly or through the kube-apiserver (same path);
the scale subresource, pods and the HPA's own status come from the kube-apiserver.
Errors become the `MetricFailure` texts client-go and metrics/client.go would produce.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from adapter.config.kube import KubeAPIConfig
from adapter.hpa.controller import MetricFailure, MetricReading
from adapter.hpa.manifest import scaled_to_zero_of
from adapter.hpa.replicas import Pods, sum_usage
from adapter.hpa.spec import ExternalMetric, ObjectReference, selector_query
from adapter.k8s_wire.quantity import QuantityError, quantity_milli
from adapter.kube.client import KubeClient
from adapter.kube.errors import KubeAPIError, KubeError
from adapter.kube.kubeconfig import resolve_api_server

_FETCH_FAILED = "unable to fetch metrics from external metrics API"


def adapter_client(
    url: str,
    *,
    ca_file: Path | None = None,
    token_file: Path | None = None,
    client_cert: Path | None = None,
    client_key: Path | None = None,
    insecure: bool = False,
) -> KubeClient:
    """A client for an external metrics API server reached directly (an adapter), not through a cluster."""
    config = KubeAPIConfig(
        url=url, ca_file=ca_file, token_file=token_file, client_cert_file=client_cert, client_key_file=client_key
    )
    endpoint = resolve_api_server(config)
    if insecure and endpoint.ssl is not None:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        if client_cert and client_key:
            context.load_cert_chain(str(client_cert), str(client_key))
        endpoint = replace(endpoint, ssl=context)
    return KubeClient(endpoint, config.timeout)


def external_metric_path(namespace: str, metric: ExternalMetric) -> str:
    """The list call: metric name lower-cased by client-go, selector as `url.Values.Encode()` writes it."""
    path = (
        f"/apis/external.metrics.k8s.io/v1beta1/namespaces/{quote(namespace, safe='')}/"
        f"{quote(metric.name.lower(), safe='')}"
    )
    query = selector_query(metric.selector)
    return f"{path}?{urlencode({'labelSelector': query})}" if query else path


def usage_from_list(body: Mapping[str, Any]) -> MetricReading:
    """Σ MilliValue over an ExternalMetricValueList's items; no items is an error, never a zero."""
    items = body.get("items")
    if not isinstance(items, list):
        return MetricFailure(f"{_FETCH_FAILED}: the response is not an ExternalMetricValueList")
    if not items:
        return MetricFailure("no metrics returned from external metrics API")
    values = []
    for item in items:
        try:
            values.append(quantity_milli(item["value"]))
        except (KeyError, TypeError, QuantityError) as err:
            return MetricFailure(f"{_FETCH_FAILED}: an item has no valid value: {err}")
    return sum_usage(values)


async def read_external_metric(client: KubeClient, namespace: str, metric: ExternalMetric) -> MetricReading:
    try:
        _, body = await client.request("GET", external_metric_path(namespace, metric))
    except KubeAPIError as err:
        return MetricFailure(f"{_FETCH_FAILED}: {err.message}")  # client-go shows the Status message
    except KubeError as err:
        return MetricFailure(f"{_FETCH_FAILED}: {err}")
    return usage_from_list(body)


def _collection_prefix(api_version: str, namespace: str) -> str:
    group_version = api_version or "apps/v1"
    root = "/api/v1" if group_version == "v1" else f"/apis/{group_version}"
    return f"{root}/namespaces/{quote(namespace, safe='')}"


@dataclass(frozen=True)
class Scale:
    spec_replicas: int
    status_replicas: int
    selector: str  # status.selector, in query-parameter syntax


async def read_scale(client: KubeClient, namespace: str, target: ObjectReference) -> Scale:
    """GET the scale subresource; the resource is the kind's lower-case plural (deployments, statefulsets...)."""
    resource = f"{target.kind.lower()}s"
    path = f"{_collection_prefix(target.api_version, namespace)}/{resource}/{quote(target.name, safe='')}/scale"
    _, body = await client.request("GET", path)
    spec, status = body.get("spec") or {}, body.get("status") or {}
    # spec.replicas is omitted at 0 (docs/protocols.md#scale-subresource).
    return Scale(int(spec.get("replicas", 0)), int(status.get("replicas", 0)), str(status.get("selector") or ""))


def _ready(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status") or {}
    if status.get("phase") != "Running":
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])


async def read_pods(client: KubeClient, namespace: str, selector: str) -> Pods:
    """Pods under the scale selector; ready = phase Running and condition Ready (getReadyPodsCount)."""
    path = f"/api/v1/namespaces/{quote(namespace, safe='')}/pods"
    if selector:
        path += f"?{urlencode({'labelSelector': selector})}"
    _, body = await client.request("GET", path)
    pods = body.get("items") or []
    return Pods(len(pods), sum(1 for pod in pods if _ready(pod)))


async def read_scaled_to_zero(client: KubeClient, namespace: str, name: str) -> bool | None:
    """The live HPA's ScaledToZero condition; None when the HPA or the condition does not exist."""
    path = (
        f"/apis/autoscaling/v2/namespaces/{quote(namespace, safe='')}/horizontalpodautoscalers/{quote(name, safe='')}"
    )
    try:
        _, body = await client.request("GET", path)
    except KubeAPIError as err:
        if err.status == 404:
            return None
        raise
    return scaled_to_zero_of(body.get("status"))
