"""`zeroscale doctor` against the Kubernetes API stand-in: a healthy installation, then each usual breakage.

The breakages are the common causes of `FailedDiscoveryCheck` and `unable to fetch metrics` (kedacore/keda
#1613, #3778, #5946): another provider owns the APIService, the port or its name does not match, no ready
endpoint, the certificate names the wrong host or is not signed by the caBundle, RBAC.
"""

from __future__ import annotations

import base64
import datetime
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from adapter.certs import issue
from adapter.config.kube import KubeAPIConfig
from adapter.config.proxy import ProxyConfig
from adapter.doctor.checks import HPA_USER, Doctor, Installation
from adapter.doctor.findings import Finding
from adapter.kube.client import KubeClient
from adapter.kube.leases import micro_time
from tests.doctor.fixtures import (
    ADAPTER_SA,
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
    run_doctor,
    unavailable,
)


def failures(findings: list[Finding]) -> dict[str, str]:
    return {f.check: f"{f.message} -> {f.hint}" for f in findings if f.level == "fail"}


async def test_a_healthy_installation_has_no_problems(cluster: Cluster) -> None:
    findings = await run_doctor(cluster)
    assert failures(findings) == {}
    checks = {f.check for f in findings if f.level == "ok"}
    assert {"APIService", "APIService Available", "ready endpoints", "caBundle", "HPA controller RBAC"} <= checks
    # The HPA check asks for a metric the adapter serves, as the HPA controller would.
    (hpa_review,) = [r["spec"] for r in cluster.kube.access_reviews if r["spec"]["user"] == HPA_USER]
    assert hpa_review["resourceAttributes"]["resource"] == "kafka-lag"
    assert hpa_review["resourceAttributes"]["verb"] == "list"


async def test_the_version_and_scale_to_zero_on_v1_37(cluster: Cluster) -> None:
    findings = {f.check: f for f in await run_doctor(cluster)}
    assert (findings["Kubernetes version"].level, findings["Kubernetes version"].message) == ("ok", "v1.37.2")
    assert findings["HPA scale to zero"].level == "ok"
    assert "records ScaledToZero" in findings["HPA scale to zero"].message
    assert cluster.hpa_dry_runs == ["All"], "asked by a dry run: nothing is created"


async def test_a_cluster_whose_hpa_cannot_scale_to_zero_says_what_is_lost(cluster: Cluster) -> None:
    cluster.minor = 36
    findings = {f.check: f for f in await run_doctor(cluster)}
    found = findings["HPA scale to zero"]
    assert found.level == "warn"
    assert "not available on v1.36.2: an HPA with minReplicas: 0 is refused" in found.message
    assert "nothing scales one back to 0" in found.message
    assert "HPAScaleToZero=true" in found.hint


async def test_the_alpha_gate_before_v1_37_lacks_the_scaled_to_zero_condition(cluster: Cluster) -> None:
    cluster.minor, cluster.gate_on = 35, True
    found = {f.check: f for f in await run_doctor(cluster)}["HPA scale to zero"]
    assert found.level == "warn"
    assert "available on v1.35.2 (minReplicas: 0 accepted), but before v1.37 the HPA records no" in found.message


async def test_an_unsupported_release_fails(cluster: Cluster) -> None:
    cluster.minor = 32
    problems = failures(await run_doctor(cluster))
    assert "older than v1.33" in problems["Kubernetes version"]


async def test_no_apiservice(cluster: Cluster) -> None:
    cluster.kube.delete(APISERVICES, APISERVICE_NAME)
    problems = failures(await run_doctor(cluster))
    assert "no APIService v1beta1.external.metrics.k8s.io" in problems["APIService"]


async def test_another_provider_owns_the_apiservice(cluster: Cluster) -> None:
    def to_keda(obj: dict[str, Any]) -> None:
        obj["spec"]["service"] = {"name": "keda-operator-metrics-apiserver", "namespace": "keda", "port": 443}
        obj["metadata"]["labels"] = {"app.kubernetes.io/name": "keda-operator-metrics-apiserver"}

    cluster.update(APISERVICES, APISERVICE_NAME, to_keda)
    problems = failures(await run_doctor(cluster))
    assert "another provider owns" in problems["APIService"]
    assert "keda/keda-operator-metrics-apiserver" in problems["APIService"]


async def test_failed_discovery_check_is_explained(cluster: Cluster) -> None:
    def failing(obj: dict[str, Any]) -> None:
        message = "failing or missing response from https://10.0.0.7:6443/apis/external.metrics.k8s.io/v1beta1: 403"
        obj["status"] = {
            "conditions": [
                {"type": "Available", "status": "False", "reason": "FailedDiscoveryCheck", "message": message}
            ]
        }

    cluster.update(APISERVICES, APISERVICE_NAME, failing)
    cluster.discovery = unavailable("FailedDiscoveryCheck", "the server is currently unable to handle the request")
    problems = failures(await run_doctor(cluster))
    assert "FailedDiscoveryCheck" in problems["APIService Available"]
    assert "401/403" in problems["APIService Available"]
    assert "503" in problems["discovery GET /apis/external.metrics.k8s.io/v1beta1"]


async def test_the_apiservice_port_is_not_a_service_port(cluster: Cluster) -> None:
    cluster.update(APISERVICES, APISERVICE_NAME, lambda obj: obj["spec"]["service"].update(port=6443))
    problems = failures(await run_doctor(cluster))
    assert "has no port 6443" in problems["Service zeroscale/zeroscale-adapter"]
    assert "https=443" in problems["Service zeroscale/zeroscale-adapter"]


async def test_endpoint_port_name_does_not_match(cluster: Cluster) -> None:
    cluster.update(SLICES, "zeroscale-adapter-abcde", lambda obj: obj["ports"][0].update(name="web"))
    problems = failures(await run_doctor(cluster))
    assert "no EndpointSlice port is named https" in problems["ready endpoints"]
    assert "web" in problems["ready endpoints"]


async def test_an_external_name_service_needs_no_endpoints(cluster: Cluster) -> None:
    """The aggregator checks EndpointSlices only for a ClusterIP Service; for an ExternalName one it dials the
    name (the e2e control plane registers the adapter so)."""
    cluster.kube.delete(SLICES, "zeroscale-adapter-abcde")
    assert "has no EndpointSlices" in failures(await run_doctor(cluster))["ready endpoints"]
    cluster.update(SERVICES, "zeroscale-adapter", lambda obj: obj["spec"].update(type="ExternalName"))
    findings = await run_doctor(cluster)
    assert failures(findings) == {}
    (endpoints,) = [f for f in findings if f.check == "ready endpoints"]
    assert "not a ClusterIP Service" in endpoints.message


async def test_no_ready_endpoint(cluster: Cluster) -> None:
    def not_ready(obj: dict[str, Any]) -> None:
        for endpoint in obj["endpoints"]:
            endpoint["conditions"] = {"ready": False}

    cluster.update(SLICES, "zeroscale-adapter-abcde", not_ready)
    assert "none ready" in failures(await run_doctor(cluster))["ready endpoints"]


async def test_the_certificate_names_another_service(cluster: Cluster) -> None:
    ca_bundle = cluster.apiservice()["spec"]["caBundle"]
    other = issue("metrics-adapter", "monitoring", days=90)

    def replace(obj: dict[str, Any]) -> None:
        obj["data"]["tls.crt"] = base64.b64encode(other.cert_pem).decode()

    cluster.update(SECRETS, "zeroscale-adapter-serving", replace)
    problems = failures(await run_doctor(cluster))
    assert "does not name zeroscale-adapter.zeroscale.svc" in problems["serving certificate names"]
    assert "metrics-adapter.monitoring.svc" in problems["serving certificate names"]
    # ... and that certificate's CA is not the caBundle's either.
    assert cluster.apiservice()["spec"]["caBundle"] == ca_bundle
    assert "did not sign the serving certificate" in problems["caBundle"]


async def test_the_ca_bundle_is_from_another_ca(cluster: Cluster) -> None:
    stranger = issue("zeroscale-adapter", "zeroscale", days=90).ca_pem
    cluster.update(
        APISERVICES, APISERVICE_NAME, lambda obj: obj["spec"].update(caBundle=base64.b64encode(stranger).decode())
    )
    problems = failures(await run_doctor(cluster))
    assert set(problems) == {"caBundle"}
    assert "unknown authority" in problems["caBundle"]


async def test_no_ca_bundle_points_at_cert_manager(cluster: Cluster) -> None:
    def injected(obj: dict[str, Any]) -> None:
        del obj["spec"]["caBundle"]
        obj["metadata"]["annotations"] = {"cert-manager.io/inject-ca-from": "zeroscale/zeroscale-adapter-serving"}

    cluster.update(APISERVICES, APISERVICE_NAME, injected)
    problem = failures(await run_doctor(cluster))["APIService"]
    assert "no caBundle" in problem
    assert "cainjector" in problem


async def test_an_expired_certificate(cluster: Cluster) -> None:
    client = KubeClient.from_config(KubeAPIConfig(kubeconfig=cluster.kubeconfig))
    later = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=91)
    try:
        findings = await Doctor(client, Installation(), now=later).run()
    finally:
        await client.close()
    assert "expired" in failures(findings)["serving certificate validity"]


async def test_the_hpa_may_not_read_external_metrics(cluster: Cluster) -> None:
    cluster.denied.add((HPA_USER, "kafka-lag"))
    problem = failures(await run_doctor(cluster))["HPA controller RBAC"]
    assert "may not list external.metrics.k8s.io" in problem
    assert "hpa-rbac.yaml" in problem


async def test_the_adapter_may_not_review_tokens(cluster: Cluster) -> None:
    cluster.denied.add((ADAPTER_SA, "tokenreviews"))
    problems = failures(await run_doctor(cluster))
    assert set(problems) == {"adapter RBAC: create TokenReviews"}
    assert "system:auth-delegator" in problems["adapter RBAC: create TokenReviews"]


async def test_a_missing_service(cluster: Cluster) -> None:
    cluster.kube.delete(SERVICES, "zeroscale-adapter")
    problems = failures(await run_doctor(cluster))
    assert "ServiceNotFound" in problems["Service zeroscale/zeroscale-adapter"]


def _cli(cluster: Cluster) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "adapter", "doctor", "--kubeconfig", str(cluster.kubeconfig)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
        env={**os.environ, "KUBECONFIG": "/nonexistent"},
    )


def test_the_command_reports_in_plain_words_and_exits_by_result(cluster: Cluster) -> None:
    healthy = _cli(cluster)
    assert healthy.returncode == 0, healthy.stdout + healthy.stderr
    assert healthy.stdout.rstrip().endswith("no problems found")
    cluster.update(SLICES, "zeroscale-adapter-abcde", lambda obj: obj["ports"][0].update(name="web"))
    broken = _cli(cluster)
    assert broken.returncode == 1
    assert "[FAIL] ready endpoints: no EndpointSlice port is named https" in broken.stdout
    assert "1 problem(s) found" in broken.stdout


def grpc_findings(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.check == "gRPC client certificates"]


async def test_the_shipped_grpc_ports_require_client_certificates(cluster: Cluster) -> None:
    (finding,) = grpc_findings(await run_doctor(cluster))
    assert finding.level == "ok"


async def test_an_unauthenticated_grpc_scaler_is_a_warning(cluster: Cluster) -> None:
    """Issue 12 item 4: the doctor reads the config the adapter's pods mount and warns about allow_unauthenticated."""
    (config_map,) = cluster.kube.objects(CONFIGMAPS)

    def open_scaler(obj: dict[str, Any]) -> None:
        config = yaml.safe_load(obj["data"]["config.yaml"])
        config["grpc"]["scaler"]["tls"].pop("client_ca_file")
        config["grpc"]["scaler"]["tls"].pop("client_names")  # names need client certificates
        config["grpc"]["scaler"]["allow_unauthenticated"] = True
        obj["data"]["config.yaml"] = yaml.safe_dump(config)

    cluster.update(CONFIGMAPS, config_map["metadata"]["name"], open_scaler)
    (finding,) = grpc_findings(await run_doctor(cluster))
    assert finding.level == "warn"
    assert finding.message.startswith("grpc.scaler: no client certificates (allow_unauthenticated: true) on 0.0.0.0")
    assert "client_ca_file" in finding.hint


async def test_grpc_settings_that_stop_the_pods_are_a_failure(cluster: Cluster) -> None:
    (config_map,) = cluster.kube.objects(CONFIGMAPS)

    def drop_client_ca(obj: dict[str, Any]) -> None:
        config = yaml.safe_load(obj["data"]["config.yaml"])
        config["grpc"]["counts"]["tls"].pop("client_ca_file")
        config["grpc"]["counts"]["tls"].pop("client_names")  # names need client certificates
        obj["data"]["config.yaml"] = yaml.safe_dump(config)

    cluster.update(CONFIGMAPS, config_map["metadata"]["name"], drop_client_ca)
    assert "allow_unauthenticated" in failures(await run_doctor(cluster))["gRPC client certificates"]


LEASES = f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases"


def with_activator_route(cluster: Cluster) -> None:
    """The proxy's Deployment, its config given route `web` in mode activator (proxy Service zeroscale-proxy)."""
    cluster.kube.put(DEPLOYMENTS, _one(rendered_base(), "Deployment", "zeroscale-proxy"))
    cluster.kube.serve_collection(re.escape(LEASES), "LeaseList")
    (config_map,) = cluster.kube.objects(CONFIGMAPS)

    def activator(obj: dict[str, Any]) -> None:
        config = yaml.safe_load(obj["data"]["config.yaml"])
        config["proxy"]["activator"] = {
            "proxy_service": {"service": "zeroscale-proxy", "namespace": NS},
            "lease_namespace": NS,
        }
        route = config["proxy"]["routes"][0]
        route.update(mode="activator", activator={"service": "web-direct", "port": 8081})
        obj["data"]["config.yaml"] = yaml.safe_dump(config)

    cluster.update(CONFIGMAPS, config_map["metadata"]["name"], activator)


def put_lease(cluster: Cluster, holder: str, routes: list[str] | None, renewed: str | None = None) -> None:
    annotations = {} if routes is None else {"zeroscale.io/activator-routes": json.dumps(routes)}
    spec: dict[str, Any] = {"holderIdentity": holder, "leaseDurationSeconds": 15}
    if renewed is not None:
        spec["renewTime"] = renewed
    cluster.kube.put(
        LEASES,
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            # The default name follows the proxy Service: zeroscale-proxy-activator.
            "metadata": {"name": "zeroscale-proxy-activator", "namespace": NS, "annotations": annotations},
            "spec": spec,
        },
    )


def activator_findings(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.check == "activator Lease"]


async def test_without_activator_routes_the_lease_is_not_checked(cluster: Cluster) -> None:
    cluster.kube.put(DEPLOYMENTS, _one(rendered_base(), "Deployment", "zeroscale-proxy"))
    (finding,) = activator_findings(await run_doctor(cluster))
    assert (finding.level, finding.message) == ("skip", "no route in mode: activator")


async def test_a_lease_holder_that_does_not_write_this_installations_routes_is_a_failure(cluster: Cluster) -> None:
    """Issue 28, finding 8: another installation's proxy holds the Lease (shared lease_name): this one's Services get
    no slices, which nothing said."""
    with_activator_route(cluster)
    put_lease(cluster, "other-proxy-7d9f", ["shop/api@0123456789ab"])
    (finding,) = activator_findings(await run_doctor(cluster))
    assert finding.level == "fail"
    assert "other-proxy-7d9f, does not write routes of this config: zeroscale-demo/web (not written)" in finding.message
    assert "lease_name" in finding.hint


async def test_a_lease_holder_that_writes_this_installations_routes_is_ok(cluster: Cluster) -> None:
    with_activator_route(cluster)
    (config_map,) = cluster.kube.objects(CONFIGMAPS)
    proxy = ProxyConfig.model_validate(yaml.safe_load(config_map["data"]["config.yaml"])["proxy"])
    put_lease(cluster, "zeroscale-proxy-5c6b", sorted(proxy.activator_routes().values()))
    (finding,) = activator_findings(await run_doctor(cluster))
    assert (finding.level, finding.message) == (
        "ok",
        "the holder of Lease zeroscale/zeroscale-proxy-activator, zeroscale-proxy-5c6b, writes every activator route",
    )
    put_lease(cluster, "", None)  # given up, and nobody took it
    (finding,) = activator_findings(await run_doctor(cluster))
    assert finding.level == "fail"
    assert finding.message.startswith("nobody holds Lease zeroscale/zeroscale-proxy-activator")


async def test_a_lease_holder_that_stopped_renewing_is_a_failure(cluster: Cluster) -> None:
    """A holder killed without giving the Lease up (a lost node, an OOM kill) with no replica left to take it, or
    one whose Role no longer lets it update leases: the Lease still names it, and nobody writes the slices."""
    with_activator_route(cluster)
    (config_map,) = cluster.kube.objects(CONFIGMAPS)
    proxy = ProxyConfig.model_validate(yaml.safe_load(config_map["data"]["config.yaml"])["proxy"])
    served = sorted(proxy.activator_routes().values())
    now = datetime.datetime.now(datetime.UTC)
    put_lease(cluster, "zeroscale-proxy-5c6b", served, micro_time(now - datetime.timedelta(hours=3)))
    (finding,) = activator_findings(await run_doctor(cluster))
    assert finding.level == "fail"
    assert "zeroscale-proxy-5c6b, has not renewed it for 3:0" in finding.message
    assert "get/update on this one" in finding.hint
    put_lease(cluster, "zeroscale-proxy-5c6b", served, micro_time(now - datetime.timedelta(seconds=3)))
    (finding,) = activator_findings(await run_doctor(cluster))
    assert finding.level == "ok"


async def test_a_lease_holder_that_does_not_say_what_it_writes_is_not_judged_and_says_why(cluster: Cluster) -> None:
    """An older proxy (before zeroscale.io/activator-routes), during a rollout: unknown, not a pass or a failure."""
    with_activator_route(cluster)
    put_lease(cluster, "zeroscale-proxy-old", None)
    (finding,) = activator_findings(await run_doctor(cluster))
    assert finding.level == "skip"
    assert "zeroscale-proxy-old, does not say what it writes" in finding.message
    assert "older version" in finding.hint
