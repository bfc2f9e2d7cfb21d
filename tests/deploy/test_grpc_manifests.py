"""The shipped gRPC ports require client certificates, and only their one client may reach them (issue 12 item 4)."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from adapter.config import ZeroscaleConfig
from adapter.config.http import HTTPSource
from adapter.config.loader import load_config
from tests.fixtures.manifests import DEPLOY, EXAMPLE_CONFIGS, Objects, find

ADAPTER, PROXY = "zeroscale-adapter", "zeroscale-proxy"


def mounted_secret(deployment: dict[str, Any], path: str) -> str:
    """The Secret mounted at `path` in the deployment's pods."""
    pod = deployment["spec"]["template"]["spec"]
    mounts = [m for c in [*pod.get("initContainers", []), *pod["containers"]] for m in c.get("volumeMounts", [])]
    (volume_name,) = [m["name"] for m in mounts if m["mountPath"] == path]
    (volume,) = [v for v in pod["volumes"] if v["name"] == volume_name]
    name: str = volume["secret"]["secretName"]
    return name


def test_both_grpc_servers_require_client_certificates() -> None:
    config = load_config(DEPLOY / "base" / "zeroscale.yaml")
    for server in (config.grpc.scaler, config.grpc.counts):
        assert server.enabled
        assert server.tls is not None
        assert server.tls.client_ca_file is not None
        assert str(server.tls.client_ca_file).startswith("/etc/zeroscale/tls/")
        assert not server.allow_unauthenticated
        assert not server.allow_plaintext
    assert not config.grpc.unauthenticated()


def test_only_keda_reaches_the_scaler_and_only_the_adapter_the_counts(rendered: dict[str, Objects]) -> None:
    for overlay in ("cert-manager", "certs", "keda"):
        objects = rendered[overlay]
        adapter = find(objects, "NetworkPolicy", ADAPTER)["spec"]["ingress"]
        grpc_rules = [rule for rule in adapter if any(port["port"] == "grpc" for port in rule["ports"])]
        assert grpc_rules == [
            {
                "from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "keda"}}}],
                "ports": [{"port": "grpc", "protocol": "TCP"}],
            }
        ]
        proxy = find(objects, "NetworkPolicy", PROXY)["spec"]["ingress"]
        (counts_rule,) = [rule for rule in proxy if any(port["port"] == "counts" for port in rule["ports"])]
        assert counts_rule["from"] == [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": ADAPTER}}}]


@pytest.mark.parametrize("overlay", ["cert-manager", "certs", "keda"])
def test_every_grpc_port_has_its_certificate_and_ca(rendered: dict[str, Objects], overlay: str) -> None:
    objects = rendered[overlay]
    for deployment in (ADAPTER, PROXY):
        secret = mounted_secret(find(objects, "Deployment", deployment), "/etc/zeroscale/tls")
        if overlay == "certs":
            found = find(objects, "Secret", secret)
            assert {"tls.crt", "tls.key", "ca.crt"} <= set(found["data"])
        else:
            (certificate,) = [o for o in objects if o["kind"] == "Certificate" and o["spec"]["secretName"] == secret]
            assert certificate["spec"]["issuerRef"] == {"name": "zeroscale-ca", "kind": "Issuer"}
            if deployment == ADAPTER:  # it is also the adapter's client certificate towards the proxies
                assert "client auth" in certificate["spec"]["usages"]
            else:
                assert "zeroscale-proxy-counts.zeroscale.svc" in certificate["spec"]["dnsNames"]


def test_the_keda_overlay_issues_keda_a_client_certificate(rendered: dict[str, Objects]) -> None:
    certificate = find(rendered["keda"], "Certificate", "zeroscale-keda-client")
    assert certificate["spec"]["usages"][0] == "client auth"
    assert certificate["spec"]["issuerRef"] == {"name": "zeroscale-ca", "kind": "Issuer"}


def test_the_certs_overlay_carries_keda_and_counts_certificates_from_one_ca(rendered: dict[str, Objects]) -> None:
    secrets = {o["metadata"]["name"]: o for o in rendered["certs"] if o["kind"] == "Secret"}
    keda = secrets["zeroscale-keda-client"]  # no hash suffix: the KEDA example copies it by this name
    ca = x509.load_pem_x509_certificate(base64.b64decode(keda["data"]["ca.crt"]))
    client = x509.load_pem_x509_certificate(base64.b64decode(keda["data"]["tls.crt"]))
    client.verify_directly_issued_by(ca)
    assert ExtendedKeyUsageOID.CLIENT_AUTH in client.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    (counts,) = [s for name, s in secrets.items() if name.startswith("zeroscale-proxy-counts-")]
    served = x509.load_pem_x509_certificate(base64.b64decode(counts["data"]["tls.crt"]))
    served.verify_directly_issued_by(ca)
    names = served.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "zeroscale-proxy-counts.zeroscale.svc" in names.get_values_for_type(x509.DNSName)


def test_the_keda_example_presents_a_client_certificate() -> None:
    documents = [d for d in yaml.safe_load_all((DEPLOY / "examples" / "keda-scaledobject.yaml").read_text()) if d]
    (auth,) = [d for d in documents if d["kind"] == "TriggerAuthentication"]
    parameters = {ref["parameter"] for ref in auth["spec"]["secretTargetRef"]}
    assert parameters == {"caCert", "tlsClientCert", "tlsClientKey"}


def test_every_http_source_of_the_examples_uses_mutual_tls(tmp_path: Path) -> None:
    base = yaml.safe_load((DEPLOY / "base" / "zeroscale.yaml").read_text())
    sources = []
    for fragment in EXAMPLE_CONFIGS:
        config = ZeroscaleConfig(**(base | yaml.safe_load(fragment.read_text())))
        sources += [source for source in config.sources if isinstance(source, HTTPSource)]
    assert len(sources) == 3
    for source in sources:
        assert source.tls is not None
        assert source.tls.cert_file is not None
        assert source.tls_server_name == "zeroscale-proxy-counts.zeroscale.svc"


def test_the_sidecar_counts_port_requires_client_certificates(monkeypatch: pytest.MonkeyPatch) -> None:
    documents = [d for d in yaml.safe_load_all((DEPLOY / "examples" / "sidecar-proxy.yaml").read_text()) if d]
    (gateway,) = [d for d in documents if d["kind"] == "Deployment" and d["metadata"]["name"] == "gateway"]
    (sidecar,) = gateway["spec"]["template"]["spec"]["initContainers"]
    monkeypatch.delenv("ZEROSCALE_CONFIG", raising=False)
    for variable in sidecar["env"]:
        # The downward API's values (the pod's namespace) are the kubelet's to fill: the Deployment's namespace here.
        value = variable.get("value", gateway["metadata"].get("namespace", "default"))
        monkeypatch.setenv(variable["name"], value)
    counts = load_config(None).grpc.counts
    assert counts.bind == "0.0.0.0"
    assert counts.verifies_clients
    assert counts.client_names == {"zeroscale-adapter.zeroscale.svc"}  # as deploy/base: the adapter only
    assert not counts.allow_unauthenticated
    assert mounted_secret(gateway, "/etc/zeroscale/tls") == "gateway-proxy-counts"


def _names(cert: x509.Certificate) -> set[str]:
    """The names gRPC reads as the peer's identity: subjectAltName DNS names, else the common name."""
    try:
        return set(
            cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
        )
    except x509.ExtensionNotFound:
        return {str(a.value) for a in cert.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)}


def test_each_port_admits_only_its_client_and_every_way_of_issuing_names_it(rendered: dict[str, Objects]) -> None:
    """Review finding 6: the scaler takes only KEDA's certificate, the counts port only the adapter's; the
    names `zeroscale certs`, the certs overlay and cert-manager issue are the ones listed."""
    from adapter.certs import issue

    config = load_config(DEPLOY / "base" / "zeroscale.yaml")
    scaler, counts = config.grpc.scaler.client_names, config.grpc.counts.client_names
    assert scaler == {"keda"}
    assert len(counts) == 1
    issued = issue(ADAPTER, "zeroscale", 1)
    adapter_cert = x509.load_pem_x509_certificate(issued.cert_pem)
    keda_cert = x509.load_pem_x509_certificate(issued.keda.cert_pem)
    assert counts <= _names(adapter_cert)
    assert not scaler & _names(adapter_cert)
    assert scaler <= _names(keda_cert)
    assert not counts & _names(keda_cert)
    secrets = {o["metadata"]["name"]: o for o in rendered["certs"] if o["kind"] == "Secret"}
    keda_secret = x509.load_pem_x509_certificate(base64.b64decode(secrets["zeroscale-keda-client"]["data"]["tls.crt"]))
    assert scaler <= _names(keda_secret)
    for overlay in ("cert-manager", "keda"):
        serving = find(rendered[overlay], "Certificate", "zeroscale-adapter-serving")["spec"]
        assert counts <= set(serving["dnsNames"])
    assert scaler <= set(find(rendered["keda"], "Certificate", "zeroscale-keda-client")["spec"]["dnsNames"])
