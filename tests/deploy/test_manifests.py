"""The manifests: every overlay renders, every object validates against Kubernetes 1.37, and the pieces agree.

Schemas: kubernetes-validate's `1.37.0` (strict: unknown fields are errors). Custom resources (cert-manager,
Prometheus Operator, KEDA) have no schema there; they are checked for the fields the installation relies on. Our own
ZeroscaleRoutes are checked against the CRD's schema (tests/fixtures/route_crd.py).
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml
from cryptography import x509

from adapter.config import ZeroscaleConfig
from adapter.config.http import HTTPSource
from adapter.config.loader import load_config
from adapter.config.route import ScaleTarget, ServiceUpstream
from adapter.config.route_object import API_VERSION, KIND
from tests.fixtures.manifests import DEPLOY, EXAMPLE_CONFIGS, EXAMPLES, OVERLAYS, Objects, find, kustomize
from tests.fixtures.route_crd import schema_errors

K8S_VERSION = "1.37.0"
# Custom resources and why each has no 1.37 schema to validate against.
CRD_KINDS = {
    ("cert-manager.io/v1", "Issuer"): "cert-manager CRD",
    ("cert-manager.io/v1", "Certificate"): "cert-manager CRD",
    ("monitoring.coreos.com/v1", "PodMonitor"): "Prometheus Operator CRD",
    ("monitoring.coreos.com/v1", "PrometheusRule"): "Prometheus Operator CRD",
    ("keda.sh/v1alpha1", "ScaledObject"): "KEDA CRD",
    ("keda.sh/v1alpha1", "TriggerAuthentication"): "KEDA CRD",
}
ADAPTER, PROXY, NAMESPACE = "zeroscale-adapter", "zeroscale-proxy", "zeroscale"


def validate(obj: dict[str, Any]) -> None:
    key = (obj["apiVersion"], obj["kind"])
    if key == (API_VERSION, KIND):  # our own CRD's schema (deploy/crds/)
        assert schema_errors(obj) == [], obj["metadata"]
        return
    if key in CRD_KINDS:
        assert obj["metadata"]["name"], f"{key}: a {CRD_KINDS[key]} needs a name"
        assert obj.get("spec"), f"{key}: a {CRD_KINDS[key]} needs a spec"
        return
    kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def example_objects(path: Path) -> Objects:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def containers(deployment: dict[str, Any]) -> list[dict[str, Any]]:
    spec = deployment["spec"]["template"]["spec"]
    return [*spec.get("initContainers", []), *spec["containers"]]


def port_numbers(deployment: dict[str, Any]) -> dict[str, int]:
    return {port["name"]: port["containerPort"] for c in containers(deployment) for port in c.get("ports", [])}


def set_environment(monkeypatch: pytest.MonkeyPatch, deployment: dict[str, Any], container: dict[str, Any]) -> None:
    """The container's environment as its pod gets it, the downward API's metadata.namespace included, and no
    config file: what the container's process loads."""
    monkeypatch.delenv("ZEROSCALE_CONFIG", raising=False)
    for variable in container["env"]:
        if "value" in variable:
            monkeypatch.setenv(variable["name"], variable["value"])
            continue
        assert variable["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}, variable
        monkeypatch.setenv(variable["name"], deployment["metadata"]["namespace"])


def base_config() -> ZeroscaleConfig:
    return load_config(DEPLOY / "base" / "zeroscale.yaml")


def test_the_schemas_cover_kubernetes_1_37() -> None:
    assert K8S_VERSION in kubernetes_validate.utils.all_versions()


def test_every_overlay_is_known() -> None:
    assert set(OVERLAYS) == {"activator", "beside-keda", "cert-manager", "certs", "keda", "monitoring"}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_of_every_overlay_validates(rendered: dict[str, Objects], overlay: str) -> None:
    assert rendered[overlay]
    for obj in rendered[overlay]:
        validate(obj)


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda path: path.name)
def test_every_example_validates_and_says_what_it_demonstrates(example: Path) -> None:
    assert "DEMONSTRATES:" in example.read_text().split("\n", 1)[0]
    for obj in example_objects(example):
        validate(obj)


def test_a_wrong_field_is_caught() -> None:
    """The strict validation can fail: a typo in a Deployment is an error."""
    deployment = find(kustomize(DEPLOY / "base"), "Deployment", ADAPTER)
    deployment["spec"]["replica"] = 2
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(deployment)


def test_example_configs_load(tmp_path: Path) -> None:
    for fragment in EXAMPLE_CONFIGS:
        merged = yaml.safe_load((DEPLOY / "base" / "zeroscale.yaml").read_text()) | yaml.safe_load(fragment.read_text())
        path = tmp_path / fragment.name
        path.write_text(yaml.safe_dump(merged))
        config = load_config(path)
        assert config.metrics, fragment.name


def test_every_example_hpa_metric_is_served_by_its_config() -> None:
    served = {
        metric["name"] for fragment in EXAMPLE_CONFIGS for metric in yaml.safe_load(fragment.read_text())["metrics"]
    }
    hpas = [obj for path in EXAMPLES for obj in example_objects(path) if obj["kind"] == "HorizontalPodAutoscaler"]
    assert len(hpas) == 7
    for hpa in hpas:
        for metric in hpa["spec"]["metrics"]:
            assert metric["external"]["metric"]["name"] in served


def test_every_example_scaler_trigger_names_a_served_metric() -> None:
    """KEDA's `external` / `external-push` triggers name a metric of the example configs (the scaler answers
    NOT_FOUND otherwise and KEDA makes no HPA)."""
    served = {
        metric["name"] for fragment in EXAMPLE_CONFIGS for metric in yaml.safe_load(fragment.read_text())["metrics"]
    }
    triggers = [
        trigger
        for path in EXAMPLES
        for obj in example_objects(path)
        if obj["kind"] == "ScaledObject"
        for trigger in obj["spec"]["triggers"]
        if trigger["type"] in ("external", "external-push")
    ]
    assert len(triggers) == 3
    for trigger in triggers:
        assert trigger["metadata"]["metricName"] in served, trigger


def test_the_kafka_example_wakes_from_zero(rendered: dict[str, Objects]) -> None:
    """docs/protocols.md#hpa-behavior, docs/protocols.md#hpa-scale-to-zero: minReplicas 0, an AverageValue target, a
    scale-up tolerance and a Pods policy."""
    hpa = find(
        example_objects(DEPLOY / "examples" / "kafka-consumer.yaml"), "HorizontalPodAutoscaler", "orders-consumer"
    )
    spec = hpa["spec"]
    assert spec["minReplicas"] == 0
    assert spec["metrics"][0]["external"]["target"]["type"] == "AverageValue"
    assert "tolerance" in spec["behavior"]["scaleUp"]
    assert any(policy["type"] == "Pods" for policy in spec["behavior"]["scaleUp"]["policies"])


def test_base_config_loads_and_matches_the_pod_ports(base: Objects) -> None:
    config = base_config()
    adapter_ports = port_numbers(find(base, "Deployment", ADAPTER))
    assert adapter_ports["https"] == config.server.port
    assert adapter_ports["metrics"] == config.server.metrics_port
    assert adapter_ports["grpc"] == config.grpc.scaler.port
    assert config.grpc.scaler.enabled
    assert config.grpc.scaler.tls is not None
    assert config.grpc.scaler.tls.cert_file == config.server.tls.cert_file
    proxy_ports = port_numbers(find(base, "Deployment", PROXY))
    assert proxy_ports["http"] == config.proxy.port
    assert proxy_ports["admin"] == config.proxy.admin_port
    assert proxy_ports["counts"] == config.grpc.counts.port
    assert config.grpc.counts.enabled
    assert config.server.tls.cert_file is not None
    assert str(config.server.tls.cert_file).startswith("/etc/zeroscale/tls/")


def test_apiservice_service_and_probes_agree(rendered: dict[str, Objects]) -> None:
    objects = rendered["cert-manager"]
    apiservice = find(objects, "APIService", "v1beta1.external.metrics.k8s.io")
    ref = apiservice["spec"]["service"]
    assert (ref["namespace"], ref["name"]) == (NAMESPACE, ADAPTER)
    service = find(objects, "Service", ADAPTER)
    # The aggregator matches the APIService port to a Service port, then that port's name in the EndpointSlices.
    port = next(p for p in service["spec"]["ports"] if p["port"] == ref["port"])
    assert port["name"] == "https"
    assert port["targetPort"] == "https"
    deployment = find(objects, "Deployment", ADAPTER)
    assert "https" in port_numbers(deployment)
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        get = containers(deployment)[0][probe]["httpGet"]
        assert (get["path"], get["port"], get["scheme"]) == (path, "https", "HTTPS")


def test_selectors_match_pod_labels(rendered: dict[str, Objects]) -> None:
    objects = rendered["cert-manager"]
    labels = {
        name: find(objects, "Deployment", name)["spec"]["template"]["metadata"]["labels"] for name in (ADAPTER, PROXY)
    }

    def selects(selector: dict[str, str]) -> set[str]:
        return {name for name, pod in labels.items() if selector.items() <= pod.items()}

    for obj in objects:
        spec = obj.get("spec") or {}
        if obj["kind"] == "Service":
            assert len(selects(spec["selector"])) == 1, obj["metadata"]["name"]
        elif obj["kind"] in ("PodDisruptionBudget", "Deployment"):
            assert len(selects(spec["selector"]["matchLabels"])) == 1, obj["metadata"]["name"]
    # The sidecar example's pods are what the third PodMonitor finds.
    deployments = {name: find(objects, "Deployment", name) for name in (ADAPTER, PROXY)}
    deployments["gateway"] = find(example_objects(DEPLOY / "examples" / "sidecar-proxy.yaml"), "Deployment", "gateway")
    labels["gateway"] = deployments["gateway"]["spec"]["template"]["metadata"]["labels"]
    monitors = [obj for obj in rendered["monitoring"] if obj["kind"] == "PodMonitor"]
    assert len(monitors) == 3
    for monitor in monitors:
        (name,) = selects(monitor["spec"]["selector"]["matchLabels"])
        for endpoint in monitor["spec"]["podMetricsEndpoints"]:
            assert endpoint["port"] in port_numbers(deployments[name])


def test_services_and_network_policies_name_container_ports(rendered: dict[str, Objects]) -> None:
    objects = rendered["cert-manager"]
    all_ports = {name: port_numbers(find(objects, "Deployment", name)) for name in (ADAPTER, PROXY)}
    for obj in objects:
        if obj["kind"] == "Service":
            target = next(
                n for n in all_ports if obj["spec"]["selector"].items() <= {"app.kubernetes.io/name": n}.items()
            )
            for port in obj["spec"]["ports"]:
                assert port["targetPort"] in all_ports[target]
        if obj["kind"] == "NetworkPolicy" and obj["spec"]["podSelector"]:
            name = obj["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/name"]
            for rule in obj["spec"]["ingress"]:
                for port in rule["ports"]:
                    assert port["port"] in all_ports[name]
    headless = find(objects, "Service", "zeroscale-proxy-counts")
    assert headless["spec"]["clusterIP"] == "None"
    assert "counts" in {port["name"] for port in headless["spec"]["ports"]}
    assert "grpc" in {port["name"] for port in find(objects, "Service", ADAPTER)["spec"]["ports"]}


def test_the_adapter_deployment_is_hardened(rendered: dict[str, Objects]) -> None:
    objects = rendered["cert-manager"]
    adapter = find(objects, "Deployment", ADAPTER)
    assert adapter["spec"]["replicas"] == 2
    pod = adapter["spec"]["template"]["spec"]
    assert pod["affinity"]["podAntiAffinity"]
    assert pod["serviceAccountName"] == ADAPTER
    assert find(objects, "PodDisruptionBudget", ADAPTER)["spec"]["minAvailable"] == 1
    for name in (ADAPTER, PROXY):
        pod = find(objects, "Deployment", name)["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for container in pod["containers"]:
            security = container["securityContext"]
            assert security["readOnlyRootFilesystem"] is True
            assert security["allowPrivilegeEscalation"] is False
            assert security["capabilities"] == {"drop": ["ALL"]}
            assert container["resources"]["requests"]


def test_the_rbac_binds_the_right_subjects(rendered: dict[str, Objects]) -> None:
    objects = rendered["cert-manager"]
    reader = find(objects, "RoleBinding", "zeroscale-adapter-auth-reader")
    assert reader["metadata"]["namespace"] == "kube-system"
    assert reader["roleRef"]["name"] == "extension-apiserver-authentication-reader"
    delegator = find(objects, "ClusterRoleBinding", "zeroscale-adapter:system:auth-delegator")
    assert delegator["roleRef"]["name"] == "system:auth-delegator"
    for binding in (reader, delegator):
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": ADAPTER, "namespace": NAMESPACE}]
    hpa = find(objects, "ClusterRoleBinding", "zeroscale-hpa-external-metrics")
    assert hpa["subjects"] == [
        {"kind": "ServiceAccount", "name": "horizontal-pod-autoscaler", "namespace": "kube-system"}
    ]


def test_cert_manager_overlay_injects_the_serving_certificate_ca(rendered: dict[str, Objects]) -> None:
    objects = rendered["cert-manager"]
    apiservice = find(objects, "APIService", "v1beta1.external.metrics.k8s.io")
    namespace, name = apiservice["metadata"]["annotations"]["cert-manager.io/inject-ca-from"].split("/")
    certificate = find(objects, "Certificate", name)
    assert certificate["metadata"]["namespace"] == namespace
    assert f"{ADAPTER}.{NAMESPACE}.svc" in certificate["spec"]["dnsNames"]
    volumes = find(objects, "Deployment", ADAPTER)["spec"]["template"]["spec"]["volumes"]
    secret_volume = next(v for v in volumes if "secret" in v)
    assert secret_volume["secret"]["secretName"] == certificate["spec"]["secretName"]


def test_certs_overlay_carries_the_generated_secret_and_ca_bundle(rendered: dict[str, Objects]) -> None:
    objects = rendered["certs"]
    apiservice = find(objects, "APIService", "v1beta1.external.metrics.k8s.io")
    # The adapter's serving Secret; beside it the proxies' counts and KEDA's client ones (test_grpc_manifests).
    secrets = [o for o in objects if o["kind"] == "Secret" and o["metadata"]["name"].startswith(f"{ADAPTER}-serving")]
    assert len(secrets) == 1
    assert secrets[0]["type"] == "kubernetes.io/tls"
    ca_pem = base64.b64decode(secrets[0]["data"]["ca.crt"])
    assert base64.b64decode(apiservice["spec"]["caBundle"]) == ca_pem
    serving = x509.load_pem_x509_certificate(base64.b64decode(secrets[0]["data"]["tls.crt"]))
    serving.verify_directly_issued_by(x509.load_pem_x509_certificate(ca_pem))
    volumes = find(objects, "Deployment", ADAPTER)["spec"]["template"]["spec"]["volumes"]
    # kustomize rewrote the reference to the generated (hash-suffixed) name.
    assert any(v.get("secret", {}).get("secretName") == secrets[0]["metadata"]["name"] for v in volumes)


def test_keda_overlay_leaves_the_apiservice_to_keda(rendered: dict[str, Objects]) -> None:
    kinds = {(obj["kind"], obj["metadata"]["name"]) for obj in rendered["keda"]}
    assert ("APIService", "v1beta1.external.metrics.k8s.io") not in kinds
    assert ("ClusterRole", "zeroscale-external-metrics-reader") not in kinds
    assert ("Deployment", ADAPTER) in kinds


def test_beside_keda_takes_the_apiservice_and_delegates_to_kedas_metrics_server(
    rendered: dict[str, Objects], monkeypatch: pytest.MonkeyPatch
) -> None:
    objects = rendered["beside-keda"]
    ref = find(objects, "APIService", "v1beta1.external.metrics.k8s.io")["spec"]["service"]
    assert (ref["namespace"], ref["name"]) == (NAMESPACE, ADAPTER)
    # Zeroscale's own identity may do exactly what the delegate authorizes: list external metrics, nothing else.
    role = find(objects, "ClusterRole", "zeroscale-delegate-external-metrics")
    assert role["rules"] == [{"apiGroups": ["external.metrics.k8s.io"], "resources": ["*"], "verbs": ["list"]}]
    binding = find(objects, "ClusterRoleBinding", "zeroscale-delegate-external-metrics")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": ADAPTER, "namespace": NAMESPACE}]
    # The container's environment over the shared config names KEDA's metrics server and a mounted CA.
    deployment = find(objects, "Deployment", ADAPTER)
    (adapter,) = deployment["spec"]["template"]["spec"]["containers"]
    set_environment(monkeypatch, deployment, adapter)
    delegate = base_config().delegate
    assert delegate is not None
    assert delegate.address() == ("keda-operator-metrics-apiserver.keda.svc", 443)
    mounts = {mount["name"]: mount["mountPath"] for mount in adapter["volumeMounts"]}
    volumes = {volume["name"]: volume for volume in deployment["spec"]["template"]["spec"]["volumes"]}
    (ca_volume,) = [name for name, path in mounts.items() if delegate.ca_file and delegate.ca_file.parent == Path(path)]
    assert volumes[ca_volume]["secret"]["secretName"] == "keda-metrics-ca"
    text = (DEPLOY / "overlays" / "beside-keda" / "kustomization.yaml").read_text()
    assert "--enable-apiservice-patching=false" in text
    assert "To undo" in text


def test_the_sidecar_is_configured_by_its_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sidecar example has no config file: its container environment alone must make a valid proxy."""
    gateway = find(example_objects(DEPLOY / "examples" / "sidecar-proxy.yaml"), "Deployment", "gateway")
    (sidecar,) = gateway["spec"]["template"]["spec"]["initContainers"]
    set_environment(monkeypatch, gateway, sidecar)
    config = load_config(None)
    assert config.proxy.sidecar is not None
    # Counted under the pod's namespace, where the example's HPA reads route=sidecar.
    assert [route.key for route in config.proxy.effective_routes()] == ["zeroscale-demo/sidecar"]
    assert config.grpc.counts.enabled
    assert port_numbers(gateway)["counts"] == config.grpc.counts.port
    assert port_numbers(gateway)["admin"] == config.proxy.admin_port


def test_the_activator_example_fits_together(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """deploy/examples/activator.yaml and its config: the sidecar counts under the cluster route's name, the
    route's Services are the example's (the one clients call without a selector, the one selecting the pods on
    the sidecar's port), the adapter discovers the cluster proxies and the sidecars, and the pod's shutdown
    outlasts the data plane's propagation as the comments say."""
    objects = example_objects(DEPLOY / "examples" / "activator.yaml")
    fragment = yaml.safe_load((DEPLOY / "examples" / "activator.zeroscale.yaml").read_text())
    path = tmp_path / "activator.yaml"
    path.write_text(yaml.safe_dump(yaml.safe_load((DEPLOY / "base" / "zeroscale.yaml").read_text()) | fragment))
    config = load_config(path)
    (route,) = config.proxy.routes
    assert route.mode == "activator"
    assert route.activator is not None
    assert config.proxy.activator is not None
    assert config.proxy.activator.lease_namespace == NAMESPACE
    web = find(objects, "Deployment", "web")
    pod = web["spec"]["template"]["spec"]
    sidecar, app = pod["containers"]
    set_environment(monkeypatch, web, sidecar)
    sidecar_config = load_config(None)
    assert sidecar_config.proxy.sidecar is not None
    # The sidecars count under the cluster route's key (shop/web): the adapter sums both into one series.
    assert [r.key for r in sidecar_config.proxy.effective_routes()] == [route.key]
    assert sidecar_config.proxy.sidecar.upstream == f"127.0.0.1:{port_numbers(web)['app']}"
    assert sidecar_config.grpc.counts.enabled
    assert sidecar_config.grpc.counts.verifies_clients
    ports = port_numbers(web)
    assert (ports["http"], ports["counts"]) == (sidecar_config.proxy.port, sidecar_config.grpc.counts.port)
    # Shutdown: the app serves past the sidecar's stop_delay, and the pod's grace covers the sidecar's drain.
    stop_delay = sidecar_config.proxy.stop_delay
    assert stop_delay >= 5
    assert app["lifecycle"]["preStop"]["sleep"]["seconds"] > stop_delay
    assert pod["terminationGracePeriodSeconds"] >= stop_delay + sidecar_config.proxy.grace_period
    # The Service clients call: no selector (the proxy writes its slices), its port named as the slices' port.
    called = find(objects, "Service", route.activator.service)
    assert "selector" not in called["spec"]
    assert [p["name"] for p in called["spec"]["ports"]] == [route.slice_port_name()]
    # The Service the route reads the pods from selects them on the sidecar's port.
    assert isinstance(route.upstream, ServiceUpstream)
    pods = find(objects, "Service", route.upstream.service)
    assert isinstance(route.target, ScaleTarget)
    assert pods["metadata"]["namespace"] == route.upstream.namespace == route.target.namespace
    assert pods["spec"]["selector"].items() <= web["spec"]["template"]["metadata"]["labels"].items()
    (pods_port,) = [p for p in pods["spec"]["ports"] if p["name"] == route.upstream.port]
    assert pods_port["targetPort"] == "http"
    # The adapter: both headless Services, the sidecars' one selecting the pods on their counts port.
    (source,) = config.sources
    assert isinstance(source, HTTPSource)
    names = [name.split(".")[0] for name in source.dns_names()]
    assert names == ["zeroscale-proxy-counts", "web-sidecars"]
    sidecars = find(objects, "Service", "web-sidecars")
    assert sidecars["spec"]["clusterIP"] == "None"
    assert sidecars["spec"]["selector"].items() <= web["spec"]["template"]["metadata"]["labels"].items()
    assert [p["targetPort"] for p in sidecars["spec"]["ports"]] == ["counts"]
    hpa = find(objects, "HorizontalPodAutoscaler", "web")
    metric = hpa["spec"]["metrics"][0]["external"]["metric"]
    assert metric["name"] == config.metrics[0].name
    assert metric["selector"] == {"matchLabels": {"route": route.name}}
    # The proxy's pods admit the route's own listener.
    policy = find(objects, "NetworkPolicy", "zeroscale-proxy-activator")
    assert {"port": route.activator.port, "protocol": "TCP"} in policy["spec"]["ingress"][0]["ports"]
