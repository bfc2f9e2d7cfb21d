"""Calls straight to the adapter's HTTPS port, bypassing the aggregator, with or without credentials."""

from __future__ import annotations

import datetime
import json
import ssl
import time
from http.client import HTTPSConnection
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


def call(
    port: int,
    path: str,
    ca: Path,
    client: tuple[Path, Path] | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, Any]]:
    """GET `path` on 127.0.0.1:PORT, trusting `ca`; `client` is a (certificate, key) pair to present."""
    context = ssl.create_default_context(cafile=str(ca))
    # The certificate names the Service (zeroscale-adapter.zeroscale.svc), not 127.0.0.1: the aggregator checks
    # the name (registration proves it); here the chain is what matters.
    context.check_hostname = False
    if client is not None:
        context.load_cert_chain(str(client[0]), str(client[1]))
    connection = HTTPSConnection("127.0.0.1", port, context=context, timeout=15)
    try:
        connection.request("GET", path, headers=headers or {})
        response = connection.getresponse()
        raw = response.read()
    finally:
        connection.close()
    return response.status, json.loads(raw) if raw else {}


def client_certificate(ca_cert: Path, ca_key: Path, common_name: str, out_dir: Path) -> tuple[Path, Path]:
    """A client certificate for `common_name` signed by the given CA (e.g. the front-proxy CA)."""
    issuer = x509.load_pem_x509_certificate(ca_cert.read_bytes())
    issuer_key = serialization.load_pem_private_key(ca_key.read_bytes(), password=None)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=5)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(issuer.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(issuer_key, hashes.SHA256())  # type: ignore[arg-type]
    )
    cert_path, key_path = out_dir / f"{common_name}.crt", out_dir / f"{common_name}.key"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


def counter_after(metrics_port: int, name: str, labels: dict[str, str], before: float, seconds: float = 5) -> float:
    """The sample once it differs from `before` (or `before` after `seconds`): /metrics is rendered at most once
    a second and shared by the scrapes in between, so a change shows on a scrape up to a second later."""
    deadline = time.monotonic() + seconds
    while True:
        value = counter(metrics_port, name, labels)
        if value != before or time.monotonic() > deadline:
            return value
        time.sleep(0.1)


def counter(metrics_port: int, name: str, labels: dict[str, str]) -> float:
    """One sample of the adapter's Prometheus /metrics (0 when absent)."""
    from urllib.request import urlopen

    from prometheus_client.parser import text_string_to_metric_families

    with urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return 0.0
