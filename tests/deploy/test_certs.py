"""`zeroscale certs`: the serving certificate names `<svc>.<ns>.svc`, the caBundle is its CA, the key is private."""

from __future__ import annotations

import base64
import datetime
import stat
import subprocess
import sys
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID


def test_certs_writes_a_matching_set(tmp_path: Path) -> None:
    out = tmp_path / "generated"
    done = subprocess.run(
        [sys.executable, "-m", "adapter", "certs", "--service", "metrics", "--namespace", "ops", "--out-dir", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    ca = x509.load_pem_x509_certificate((out / "ca.crt").read_bytes())
    cert = x509.load_pem_x509_certificate((out / "tls.crt").read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    assert names[0] == "metrics.ops.svc"
    assert "metrics.ops.svc.cluster.local" in names
    cert.verify_directly_issued_by(ca)
    usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.SERVER_AUTH in usages
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert stat.S_IMODE((out / "tls.key").stat().st_mode) == 0o600
    patch = yaml.safe_load((out / "apiservice-cabundle.yaml").read_text())
    assert patch["metadata"]["name"] == "v1beta1.external.metrics.k8s.io"
    assert base64.b64decode(patch["spec"]["caBundle"]) == (out / "ca.crt").read_bytes()


def test_each_run_makes_a_new_ca(tmp_path: Path) -> None:
    from adapter.certs import issue

    first, second = issue("a", "b", 1), issue("a", "b", 1)
    assert first.ca_pem != second.ca_pem
    cert = x509.load_pem_x509_certificate(first.cert_pem)
    assert cert.not_valid_after_utc - cert.not_valid_before_utc == datetime.timedelta(days=1)


def test_certs_issues_the_grpc_pairs_from_the_same_ca(tmp_path: Path) -> None:
    """The proxies' counts certificate and KEDA's client certificate, for the mutual TLS of both gRPC ports."""
    from adapter.certs import issue, write

    write(issue("zeroscale-adapter", "zeroscale", 1), tmp_path)
    ca = x509.load_pem_x509_certificate((tmp_path / "ca.crt").read_bytes())
    adapter = x509.load_pem_x509_certificate((tmp_path / "tls.crt").read_bytes())
    counts = x509.load_pem_x509_certificate((tmp_path / "counts.crt").read_bytes())
    keda = x509.load_pem_x509_certificate((tmp_path / "keda.crt").read_bytes())
    for cert in (adapter, counts, keda):
        cert.verify_directly_issued_by(ca)

    def usages(cert: x509.Certificate) -> set[x509.ObjectIdentifier]:
        return set(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)

    # The adapter's certificate serves the API and the scaler, and is its client certificate to the proxies.
    assert usages(adapter) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    assert usages(counts) == {ExtendedKeyUsageOID.SERVER_AUTH}
    assert usages(keda) == {ExtendedKeyUsageOID.CLIENT_AUTH}
    names = counts.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName)[0] == "zeroscale-proxy-counts.zeroscale.svc"
    for key in ("tls.key", "counts.key", "keda.key"):
        assert stat.S_IMODE((tmp_path / key).stat().st_mode) == 0o600
