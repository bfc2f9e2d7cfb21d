"""The Helm chart (deploy/helm/zeroscale): lint, every combination of its main switches rendered and validated
strictly against Kubernetes 1.37, its values schema refusing typos, its config loading as the processes load
it, and its three certificate modes wired the way deploy/base's overlays are.

Rendered with `helm template` from Helm built by scripts/helm/build (the pinned Go module).
"""

from __future__ import annotations

import base64
import importlib.util
import itertools
import json
import shutil
import subprocess
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from adapter.config.loader import load_config
from tests.deploy.test_manifests import port_numbers, validate
from tests.fixtures.manifests import (
    CHART,
    DEPLOY,
    EXAMPLE_CONFIGS,
    RELEASE,
    RELEASE_NAMESPACE,
    ROOT,
    Objects,
    find,
    helm_render,
    helm_template,
)

ADAPTER, PROXY, APISERVICE = "zeroscale-adapter", "zeroscale-proxy", "v1beta1.external.metrics.k8s.io"
CLUSTER_SCOPED = {"ClusterRole", "ClusterRoleBinding", "APIService"}
MODES = ("generate", "cert-manager", "secret")
# certificates.mode secret needs Secret names and a caBundle (`helm template` cannot read the cluster).
SECRET_MODE = (
    "--set",
    "certificates.secret.adapter=my-adapter-tls,certificates.secret.proxy=my-proxy-tls,"
    f"certificates.secret.caBundle={base64.b64encode(b'-----BEGIN CERTIFICATE-----').decode()}",
)


def load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("chart_generate", ROOT / "scripts" / "helm" / "generate.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def sets(**values: object) -> tuple[str, ...]:
    return ("--set", ",".join(f"{key.replace('__', '.')}={str(value).lower()}" for key, value in values.items()))


def kinds(objects: Objects) -> set[tuple[str, str]]:
    return {(obj["kind"], obj["metadata"]["name"]) for obj in objects}


def mounted_secrets(objects: Objects) -> dict[str, str]:
    """Deployment name -> the Secret its pods mount at /etc/zeroscale/tls."""
    found = {}
    for deployment in (obj for obj in objects if obj["kind"] == "Deployment"):
        pod = deployment["spec"]["template"]["spec"]
        (mount,) = [m for m in pod["containers"][0]["volumeMounts"] if m["mountPath"] == "/etc/zeroscale/tls"]
        (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
        found[deployment["metadata"]["name"]] = volume["secret"]["secretName"]
    return found


def test_helm_lint_strict_is_clean(helm: Path) -> None:
    for options in ((), sets(certificates__mode="cert-manager"), (*sets(certificates__mode="secret"), *SECRET_MODE)):
        done = subprocess.run(
            [str(helm), "lint", "--strict", str(CHART), *options], capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert "[WARNING]" not in done.stdout, done.stdout
        assert "[ERROR]" not in done.stdout, done.stdout


SWITCHES = list(itertools.product((True, False), (True, False), (True, False), MODES, (True, False)))


@pytest.mark.parametrize(
    ("adapter", "proxy", "api_service", "mode", "extras"),
    SWITCHES,
    ids=[f"adapter={a}-proxy={p}-apiService={s}-{m}-{'extras' if e else 'plain'}" for a, p, s, m, e in SWITCHES],
)
def test_every_combination_renders_valid_objects(
    helm: Path, adapter: bool, proxy: bool, api_service: bool, mode: str, extras: bool
) -> None:
    """extras: NetworkPolicies, PodMonitors, the PrometheusRule and KEDA's client certificate all on, or all off."""
    options = sets(
        adapter__enabled=adapter,
        proxy__enabled=proxy,
        apiService__enabled=api_service,
        certificates__mode=mode,
        networkPolicy__enabled=extras,
        podMonitors__enabled=extras,
        prometheusRule__enabled=extras,
        keda__clientCertificate=extras,
    )
    options += SECRET_MODE if mode == "secret" else ()
    done = helm_template(helm, *options)
    # A combination that cannot work is refused with what to change, never rendered half-working.
    complaints = [
        message
        for broken, message in (
            (api_service and not adapter, "apiService.enabled needs adapter.enabled"),
            (mode == "secret" and extras, "keda.clientCertificate needs certificates.mode"),
        )
        if broken
    ]
    if complaints:
        assert done.returncode != 0
        assert any(message in done.stderr for message in complaints), done.stderr
        return
    assert done.returncode == 0, done.stderr
    objects = [doc for doc in yaml.safe_load_all(done.stdout) if doc]
    for obj in objects:
        validate(obj)
        if obj["kind"] not in CLUSTER_SCOPED:
            assert obj["metadata"]["namespace"] in (RELEASE_NAMESPACE, "kube-system"), obj["metadata"]
    present = kinds(objects)
    assert (("Deployment", ADAPTER) in present) is adapter
    assert (("Deployment", PROXY) in present) is proxy
    assert (("APIService", APISERVICE) in present) is api_service
    assert (("ClusterRoleBinding", "zeroscale-hpa-external-metrics") in present) is api_service
    assert any(kind == "NetworkPolicy" for kind, _ in present) is (extras and (adapter or proxy))
    assert any(kind == "PodMonitor" for kind, _ in present) is extras
    assert any(kind == "PrometheusRule" for kind, _ in present) is extras
    # Every mounted Secret is made here (generate), by cert-manager (a Certificate writes it), or is the user's.
    for secret in mounted_secrets(objects).values():
        if mode == "generate":
            assert ("Secret", secret) in present
        elif mode == "cert-manager":
            assert any(o["kind"] == "Certificate" and o["spec"]["secretName"] == secret for o in objects)
        else:
            assert secret in ("my-adapter-tls", "my-proxy-tls")


@pytest.mark.parametrize(
    ("option", "complaint"),
    [
        ("adapter.replica=1", "'replica' not allowed"),
        ("networkPolicy.kedaNamespace=x", "'kedaNamespace' not allowed"),
        ("certificates.mode=self-signed", "certificates/mode"),
        ("config.server.prot=7443", "'prot' not allowed"),
        ("config.cache.interval=soon", "config/cache/interval"),
        ("config.proxy.routes[0].wake=sometimes", "config/proxy/routes/0"),
        ("config.delegate.service.nmespace=keda", "'nmespace' not allowed"),
        ("delegate.caSecret=keda-metrics-ca", "delegate.caSecret is set but config.delegate is not"),
        ("config.delegate.ca_file=/etc/zeroscale/delegate/ca.crt", "set delegate.caSecret"),
    ],
)
def test_a_typo_in_a_value_is_an_error(helm: Path, option: str, complaint: str) -> None:
    done = helm_template(helm, "--set", option)
    assert done.returncode != 0
    assert complaint in done.stderr, done.stderr


def test_an_umbrella_charts_global_values_are_accepted(helm: Path) -> None:
    """Helm gives a dependency chart `global` values: the closed schema must let them through."""
    assert helm_render(helm, "--set", "global.imageRegistry=example.org")


def config_of(objects: Objects, directory: Path) -> Path:
    path = directory / "config.yaml"
    path.write_text(find(objects, "ConfigMap", "zeroscale-config")["data"]["config.yaml"], encoding="utf-8")
    return path


def test_the_config_value_loads_with_the_processes_loader(chart_default: Objects, tmp_path: Path) -> None:
    config = load_config(config_of(chart_default, tmp_path))
    assert config.grpc.scaler.enabled
    assert config.grpc.counts.enabled
    assert port_numbers(find(chart_default, "Deployment", ADAPTER))["https"] == config.server.port


@pytest.mark.parametrize("fragment", EXAMPLE_CONFIGS, ids=lambda path: path.name)
def test_each_example_config_passes_the_schema_and_loads(helm: Path, fragment: Path, tmp_path: Path) -> None:
    """The examples' sources and metrics given as values: the generated schema admits them, the loader too."""
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"config": yaml.safe_load(fragment.read_text())}), encoding="utf-8")
    config = load_config(config_of(helm_render(helm, "--values", str(values)), tmp_path))
    assert config.metrics


def test_the_ports_come_from_the_config(helm: Path) -> None:
    options = "config.server.port=7443,config.grpc.scaler.port=7444,config.proxy.port=8081,config.grpc.counts.port=7445"
    objects = helm_render(helm, "--set", options)
    assert port_numbers(find(objects, "Deployment", ADAPTER))["https"] == 7443
    assert port_numbers(find(objects, "Deployment", ADAPTER))["grpc"] == 7444
    assert port_numbers(find(objects, "Deployment", PROXY))["http"] == 8081
    assert port_numbers(find(objects, "Deployment", PROXY))["counts"] == 7445
    grpc = next(p for p in find(objects, "Service", ADAPTER)["spec"]["ports"] if p["name"] == "grpc")
    assert grpc["port"] == 7444


def test_the_network_policy_admits_each_activator_routes_listener(helm: Path, tmp_path: Path) -> None:
    """While its workload is cold, an activator route's Service sends new connections to the proxy on the route's
    own port: a policy admitting only `http` would refuse every one of them."""
    example = yaml.safe_load((DEPLOY / "examples" / "activator.zeroscale.yaml").read_text())
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"config": {"proxy": example["proxy"]}}), encoding="utf-8")
    policy = find(helm_render(helm, "--values", str(values)), "NetworkPolicy", PROXY)
    admitted = {port["port"] for rule in policy["spec"]["ingress"] if "from" not in rule for port in rule["ports"]}
    listeners = {route["activator"]["port"] for route in example["proxy"]["routes"] if "activator" in route}
    assert listeners
    assert listeners <= admitted


def test_a_config_change_rolls_both_deployments(helm: Path, chart_default: Objects) -> None:
    changed = helm_render(helm, "--set", "config.cache.interval=2s")
    for name in (ADAPTER, PROXY):
        before = find(chart_default, "Deployment", name)["spec"]["template"]["metadata"]["annotations"]
        after = find(changed, "Deployment", name)["spec"]["template"]["metadata"]["annotations"]
        assert before["checksum/config"] != after["checksum/config"]


def pem(secret: dict[str, Any], key: str) -> bytes:
    return base64.b64decode(secret["data"][key])


def test_generated_certificates_chain_to_the_ca_bundle_and_name_the_services(helm: Path) -> None:
    objects = helm_render(helm, *sets(keda__clientCertificate=True))
    apiservice = find(objects, "APIService", APISERVICE)
    ca_pem = base64.b64decode(apiservice["spec"]["caBundle"])
    ca = x509.load_pem_x509_certificate(ca_pem)
    assert pem(find(objects, "Secret", "zeroscale-ca"), "tls.crt") == ca_pem
    expected = {
        "zeroscale-adapter-serving": ("zeroscale-adapter.zeroscale.svc", ExtendedKeyUsageOID.CLIENT_AUTH),
        "zeroscale-proxy-counts": ("zeroscale-proxy-counts.zeroscale.svc", ExtendedKeyUsageOID.SERVER_AUTH),
        "zeroscale-keda-client": (None, ExtendedKeyUsageOID.CLIENT_AUTH),
    }
    for name, (dns_name, usage) in expected.items():
        secret = find(objects, "Secret", name)
        assert secret["type"] == "kubernetes.io/tls"
        assert pem(secret, "ca.crt") == ca_pem, "both gRPC ports trust this CA for client certificates"
        leaf = x509.load_pem_x509_certificate(pem(secret, "tls.crt"))
        leaf.verify_directly_issued_by(ca)
        assert usage in leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        if dns_name:
            names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
            assert dns_name in names.get_values_for_type(x509.DNSName)
        assert int(secret["metadata"]["annotations"]["zeroscale.io/not-after"]) > 0
    assert mounted_secrets(objects) == {ADAPTER: "zeroscale-adapter-serving", PROXY: "zeroscale-proxy-counts"}


def test_cert_manager_mode_injects_the_ca_of_the_mounted_certificate(helm: Path) -> None:
    objects = helm_render(helm, *sets(certificates__mode="cert-manager"))
    apiservice = find(objects, "APIService", APISERVICE)
    assert "caBundle" not in apiservice["spec"]
    namespace, name = apiservice["metadata"]["annotations"]["cert-manager.io/inject-ca-from"].split("/")
    certificate = find(objects, "Certificate", name)
    assert namespace == RELEASE_NAMESPACE
    assert certificate["spec"]["secretName"] == mounted_secrets(objects)[ADAPTER]
    assert "client auth" in certificate["spec"]["usages"]
    assert not [o for o in objects if o["kind"] == "Secret"], "cert-manager writes the Secrets"
    own = helm_render(
        helm,
        "--set",
        "certificates.mode=cert-manager,certificates.certManager.issuerRef.name=corp,"
        "certificates.certManager.issuerRef.kind=ClusterIssuer",
    )
    assert not [o for o in own if o["kind"] == "Issuer"]
    for certificate in (o for o in own if o["kind"] == "Certificate"):
        assert certificate["spec"]["issuerRef"] == {"name": "corp", "kind": "ClusterIssuer"}


def test_secret_mode_mounts_the_named_secrets(helm: Path) -> None:
    objects = helm_render(helm, *sets(certificates__mode="secret"), *SECRET_MODE)
    assert mounted_secrets(objects) == {ADAPTER: "my-adapter-tls", PROXY: "my-proxy-tls"}
    assert find(objects, "APIService", APISERVICE)["spec"]["caBundle"] == SECRET_MODE[1].rsplit("caBundle=", 1)[1]
    done = helm_template(helm, *sets(certificates__mode="secret"))
    assert done.returncode != 0
    assert "(certificates.mode is secret)" in done.stderr


def test_two_releases_share_no_object_but_the_apiservice(helm: Path, chart_default: Objects) -> None:
    other = helm_render(helm, release="zeroscale-canary")
    cluster = {(o["kind"], o["metadata"]["name"]) for o in chart_default if o["kind"] in CLUSTER_SCOPED}
    cluster_other = {(o["kind"], o["metadata"]["name"]) for o in other if o["kind"] in CLUSTER_SCOPED}
    assert cluster & cluster_other == {("APIService", APISERVICE)}
    assert kinds(chart_default).isdisjoint(kinds(other) - {("APIService", APISERVICE)})


def test_the_generated_schema_and_readme_are_up_to_date() -> None:
    done = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "python"), str(ROOT / "scripts" / "helm" / "generate.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_stale_readme_or_schema_is_caught(tmp_path: Path) -> None:
    chart = tmp_path / "zeroscale"
    shutil.copytree(CHART, chart)
    values = chart / "values.yaml"
    values.write_text(values.read_text().replace("# -- The image of both processes.", "# -- Changed."))
    command = [str(ROOT / ".venv" / "bin" / "python"), str(ROOT / "scripts" / "helm" / "generate.py"), "--check"]
    done = subprocess.run([*command, "--chart", str(chart)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "README.md" in done.stdout
    schema = chart / "values.schema.json"
    shutil.copy(CHART / "values.yaml", values)
    document = json.loads(schema.read_text())
    del document["properties"]["config"]["properties"]["cache"]  # as if the models gained a section since
    schema.write_text(json.dumps(document, indent=2) + "\n")
    done = subprocess.run([*command, "--chart", str(chart)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "values.schema.json" in done.stdout


def test_every_value_is_documented() -> None:
    rows = load_generator().value_rows((CHART / "values.yaml").read_text())
    assert {key for key, _ in rows} >= {"certificates.mode", "apiService.enabled", "config"}
    assert [key for key, description in rows if not description] == []


def test_every_object_is_labelled_as_this_release(chart_default: Objects) -> None:
    for obj in chart_default:
        labels = obj["metadata"]["labels"]
        assert labels["app.kubernetes.io/instance"] == RELEASE
        assert labels["app.kubernetes.io/part-of"] == "zeroscale"


def test_the_examples_still_name_deploy_base(chart_default: Objects) -> None:
    """The default release (`zeroscale` in `zeroscale`) names objects as deploy/base does, so the examples and
    docs (scalerAddress zeroscale-adapter.zeroscale.svc:9443) hold for a Helm install too."""
    example = (DEPLOY / "examples" / "keda-scaledobject.yaml").read_text()
    assert "zeroscale-adapter.zeroscale.svc:9443" in example
    assert ("Service", ADAPTER) in kinds(chart_default)


DELEGATE = "config.delegate.service.namespace=keda,config.delegate.service.name=keda-operator-metrics-apiserver"
SECRETS = (
    "certificates.mode=secret,certificates.secret.adapter=a,certificates.secret.proxy=p,"
    "certificates.secret.caBundle=Yg=="
)
# Each value the chart reads, changed, with what must be on for it to matter; the render must differ.
CHANGES: dict[str, tuple[object, str]] = {
    "fullnameOverride": ("zs", ""),
    "image.repository": ("example.org/zeroscale", ""),
    "image.tag": ("9.9.9", ""),
    "image.pullPolicy": ("Always", ""),
    "imagePullSecrets": (["registry"], ""),
    "certificates.mode": ("cert-manager", ""),
    "certificates.generate.caDays": (100, ""),
    "certificates.generate.days": (100, ""),
    "certificates.certManager.issuerRef": ({"name": "corp", "kind": "ClusterIssuer"}, "certificates.mode=cert-manager"),
    "certificates.secret.adapter": ("other", SECRETS),
    "certificates.secret.proxy": ("other", SECRETS),
    "certificates.secret.caBundle": ("b3RoZXI=", SECRETS),
    "adapter.enabled": (False, "apiService.enabled=false"),
    "keda.namespace": ("keda-system", ""),
    "podMonitors.interval": ("30s", "podMonitors.enabled=true"),
    "delegate.caSecret": ("keda-metrics-ca", DELEGATE),
    "podMonitors.sidecars": (False, "podMonitors.enabled=true"),
    "podMonitors.labels": ({"release": "prometheus"}, "podMonitors.enabled=true"),
    "prometheusRule.namespace": ("monitoring", "prometheusRule.enabled=true"),
    "prometheusRule.labels": ({"release": "prometheus"}, "prometheusRule.enabled=true"),
}
# Read only where `helm template` cannot show it, and where that is tested instead.
ACTS_ON_UPGRADE = {
    "certificates.generate.renewDays": "when `helm upgrade` reissues a leaf it finds (tests/e2e/test_10_helm.py)"
}


def changed(value: object) -> object:
    """A different value of the same type, for the values CHANGES does not name."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, list):
        return [{"key": "dedicated", "operator": "Exists"}]
    if isinstance(value, dict):
        return {"cpu": "1"} if "cpu" in value or "memory" in value else {"example.org/key": "value"}
    raise AssertionError(f"no change known for {value!r}: add it to CHANGES")


def comparable(objects: Objects) -> list[dict[str, Any]]:
    """The render without what differs on every run: generated keys, and expiry only to the day."""
    out = []
    generated = any(obj["kind"] == "Secret" for obj in objects)  # certificates.mode generate: a fresh CA each time
    for obj in objects:
        obj = json.loads(json.dumps(obj))
        if obj["kind"] == "Secret":
            obj.pop("data")
            annotations = obj["metadata"]["annotations"]
            annotations["zeroscale.io/not-after"] = int(annotations["zeroscale.io/not-after"]) // 86400
        if obj["kind"] == "APIService" and generated:
            obj["spec"].pop("caBundle")
        out.append(obj)
    return out


def test_every_value_changes_the_render(helm: Path) -> None:
    """No value silently does nothing: each one in values.yaml, changed, changes what is rendered."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    keys = [key for key, _ in load_generator().value_rows((CHART / "values.yaml").read_text()) if key != "config"]
    idle = []
    for key in keys:
        if key in ACTS_ON_UPGRADE:
            continue
        default: Any = values
        for part in key.split("."):
            default = default[part]
        new, context = CHANGES.get(key, (None, ""))
        new = changed(default) if key not in CHANGES else new
        before = comparable(helm_render(helm, *(("--set", context) if context else ())))
        # The context minus the value itself (--set would win over --set-json).
        rest = ",".join(pair for pair in context.split(",") if pair and not pair.startswith(f"{key}="))
        after = comparable(
            helm_render(helm, *(("--set", rest) if rest else ()), "--set-json", f"{key}={json.dumps(new)}")
        )
        if before == after:
            idle.append(key)
    assert idle == [], f"these values change nothing in the render: {idle}"
