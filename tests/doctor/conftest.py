"""The `cluster` fixture of the doctor tests: a healthy installation on the Kubernetes API stand-in
(tests/doctor/fixtures.py)."""

from __future__ import annotations

import base64
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from adapter.certs import issue
from tests.doctor.fixtures import (
    APISERVICE_NAME,
    APISERVICES,
    CONFIGMAPS,
    DEPLOYMENTS,
    NS,
    SECRETS,
    SERVICES,
    SLICES,
    Cluster,
    _one,
    rendered_base,
    write_kubeconfig,
)
from tests.fixtures.kube_standin import KubeStandIn, Reply, StandInRequest, status_body


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    objects = rendered_base()
    issued = issue("zeroscale-adapter", NS, days=90)
    with KubeStandIn() as kube:
        kubeconfig = tmp_path / "kubeconfig"
        write_kubeconfig(kube, kubeconfig)
        state = Cluster(kube, kubeconfig)
        for pattern, kind in (
            (APISERVICES, "APIServiceList"),
            (SERVICES, "ServiceList"),
            (SLICES, "EndpointSliceList"),
        ):
            kube.serve_collection(re.escape(pattern), kind)
        kube.serve_collection(re.escape(SECRETS), "SecretList")
        kube.serve_collection(re.escape(DEPLOYMENTS), "DeploymentList")
        kube.serve_collection(re.escape(CONFIGMAPS), "ConfigMapList")
        # The adapter's Deployment and the config it mounts, as rendered.
        kube.put(DEPLOYMENTS, _one(objects, "Deployment", "zeroscale-adapter"))
        (config_map,) = [obj for obj in objects if obj["kind"] == "ConfigMap"]
        kube.put(CONFIGMAPS, config_map)

        apiservice = _one(objects, "APIService", APISERVICE_NAME)
        apiservice["spec"]["caBundle"] = base64.b64encode(issued.ca_pem).decode()
        apiservice["status"] = {
            "conditions": [{"type": "Available", "status": "True", "reason": "Passed", "message": "all checks passed"}]
        }
        kube.put(APISERVICES, apiservice)
        kube.put(SERVICES, _one(objects, "Service", "zeroscale-adapter"))
        kube.put(
            SLICES,
            {
                "kind": "EndpointSlice",
                "apiVersion": "discovery.k8s.io/v1",
                "metadata": {
                    "name": "zeroscale-adapter-abcde",
                    "labels": {"kubernetes.io/service-name": "zeroscale-adapter"},
                },
                "addressType": "IPv4",
                "endpoints": [{"addresses": ["10.0.0.7"], "conditions": {"ready": True}}, {"addresses": ["10.0.0.8"]}],
                "ports": [{"name": "https", "port": 6443, "protocol": "TCP"}],
            },
        )
        kube.put(
            SECRETS,
            {
                "kind": "Secret",
                "apiVersion": "v1",
                "type": "kubernetes.io/tls",
                "metadata": {"name": "zeroscale-adapter-serving"},
                "data": {
                    key: base64.b64encode(value).decode()
                    for key, value in (
                        ("tls.crt", issued.cert_pem),
                        ("tls.key", issued.key_pem),
                        ("ca.crt", issued.ca_pem),
                    )
                },
            },
        )
        state.discovery = Reply(
            200,
            {
                "kind": "APIResourceList",
                "apiVersion": "v1",
                "groupVersion": "external.metrics.k8s.io/v1beta1",
                "resources": [
                    {"name": "kafka-lag", "namespaced": True, "kind": "ExternalMetricValueList", "verbs": ["get"]}
                ],
            },
        )

        def discovery(_request: StandInRequest, _match: re.Match[str]) -> Reply:
            return state.discovery

        kube.add_route("GET", r"/apis/external\.metrics\.k8s\.io/v1beta1", discovery)

        def authorize(spec: dict[str, Any]) -> str:
            resource = (spec.get("resourceAttributes") or {}).get("resource", "")
            return "deny" if (spec.get("user"), resource) in state.denied else "allow"

        kube.authorize = authorize

        def version(_request: StandInRequest, _match: re.Match[str]) -> Reply:
            return Reply(200, {"major": "1", "minor": str(state.minor), "gitVersion": f"v1.{state.minor}.2"})

        def create_hpa(request: StandInRequest, _match: re.Match[str]) -> Reply:
            """The real apiserver's validation of minReplicas with HPAScaleToZero off (before v1.37)."""
            hpa = request.json()
            state.hpa_dry_runs.append(request.param("dryRun") or "")
            if state.minor < 37 and not state.gate_on and hpa["spec"].get("minReplicas") == 0:
                message = (
                    f'HorizontalPodAutoscaler.autoscaling "{hpa["metadata"]["name"]}" is invalid: '
                    "spec.minReplicas: Invalid value: 0: must be greater than or equal to 1"
                )
                return Reply(422, status_body(422, "Invalid", message))
            return Reply(201, hpa)

        kube.add_route("GET", r"/version", version)
        kube.add_route("POST", r"/apis/autoscaling/v2/namespaces/[^/]+/horizontalpodautoscalers", create_hpa)
        yield state
