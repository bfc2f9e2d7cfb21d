"""`zeroscale certs`: a private CA, the certificates of an installation's gRPC and HTTPS ports, the caBundle.

The aggregator dials `<service>.<namespace>.svc` and verifies the certificate against the APIService's
`caBundle` (docs/protocols.md#aggregator-availability), so the serving certificate carries that DNS name (plus the
shorter and longer forms in-cluster clients use) and is signed by the CA whose PEM becomes the caBundle. The same CA
signs the rest of the mutual TLS between the parts: the proxies' counts certificate (the adapter
checks `zeroscale-proxy-counts.<namespace>.svc`), and KEDA's client certificate for the gRPC scaler.
The adapter's certificate is also its client certificate towards the proxies. Both gRPC servers
trust this CA for client certificates. The CA's key is not written: renewing means running this
again, which makes a new CA, new certificates and a new caBundle together.
"""

from __future__ import annotations

import argparse
import base64
import datetime
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

APISERVICE_NAME = "v1beta1.external.metrics.k8s.io"
COUNTS_SERVICE = "zeroscale-proxy-counts"
KEDA_CLIENT = "keda"
# Issued slightly in the past: a node whose clock runs behind must not see a certificate from the future.
_BACKDATE = datetime.timedelta(minutes=5)


@dataclass(frozen=True)
class Pair:
    cert_pem: bytes
    key_pem: bytes


@dataclass(frozen=True)
class Issued:
    ca_pem: bytes
    cert_pem: bytes  # the adapter's: HTTPS API and gRPC scaler, and its client certificate to the proxies
    key_pem: bytes
    counts: Pair  # the proxies' counts port
    keda: Pair  # KEDA's client certificate for the gRPC scaler


def service_names(service: str, namespace: str) -> list[str]:
    """The DNS names a Service is reached by; `<svc>.<ns>.svc` is the one the aggregator verifies."""
    return [f"{service}.{namespace}.svc", f"{service}.{namespace}.svc.cluster.local", f"{service}.{namespace}", service]


def x509_name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def builder(
    subject: x509.Name,
    issuer: x509.Name,
    key: ec.EllipticCurvePrivateKey,
    not_before: datetime.datetime,
    not_after: datetime.datetime,
) -> x509.CertificateBuilder:
    """What every certificate made here starts with (a random serial); extensions and signing follow."""
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
    )


def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    """The private key as unencrypted PKCS#8 PEM."""
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _leaf(
    ca_key: ec.EllipticCurvePrivateKey,
    ca_name: x509.Name,
    names: list[str],
    usages: list[x509.ObjectIdentifier],
    now: datetime.datetime,
    until: datetime.datetime,
) -> Pair:
    """A certificate for `names` (the first is its subject) with these extended usages, signed by the CA."""
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        builder(x509_name(names[0]), ca_name, key, now, until)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name) for name in names]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(True, False, False, False, False, False, False, False, False), critical=True
        )  # digitalSignature
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return Pair(cert.public_bytes(serialization.Encoding.PEM), key_pem(key))


def issue(service: str, namespace: str, days: int, extra_names: list[str] | None = None) -> Issued:
    """A fresh CA and the certificates it signs, valid `days` days."""
    now = datetime.datetime.now(datetime.UTC) - _BACKDATE
    until = now + datetime.timedelta(days=days)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509_name(f"zeroscale-ca {service}.{namespace}")
    ca = (
        builder(ca_name, ca_name, ca_key, now, until)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )  # keyCertSign, cRLSign
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    names = list(dict.fromkeys([*service_names(service, namespace), *(extra_names or [])]))
    both = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
    adapter = _leaf(ca_key, ca_name, names, both, now, until)
    counts_names = service_names(COUNTS_SERVICE, namespace)
    counts = _leaf(ca_key, ca_name, counts_names, [ExtendedKeyUsageOID.SERVER_AUTH], now, until)
    keda = _leaf(ca_key, ca_name, [KEDA_CLIENT], [ExtendedKeyUsageOID.CLIENT_AUTH], now, until)
    return Issued(ca.public_bytes(serialization.Encoding.PEM), adapter.cert_pem, adapter.key_pem, counts, keda)


def apiservice_patch(ca_pem: bytes) -> str:
    """A kustomize patch setting the APIService's caBundle (base64 of the CA's PEM)."""
    bundle = base64.b64encode(ca_pem).decode("ascii")
    return (
        "# Written by `zeroscale certs`: the caBundle matching generated/ca.crt.\n"
        "apiVersion: apiregistration.k8s.io/v1\n"
        "kind: APIService\n"
        f"metadata:\n  name: {APISERVICE_NAME}\n"
        f"spec:\n  caBundle: {bundle}\n"
    )


def _write(path: Path, data: bytes, mode: int) -> None:
    # Created with its final mode, so the key is never readable by others, not even briefly.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    os.chmod(path, mode)


def write(issued: Issued, out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    files = [
        (out_dir / "ca.crt", issued.ca_pem, 0o644),
        (out_dir / "tls.crt", issued.cert_pem, 0o644),
        (out_dir / "tls.key", issued.key_pem, 0o600),
        (out_dir / "counts.crt", issued.counts.cert_pem, 0o644),
        (out_dir / "counts.key", issued.counts.key_pem, 0o600),
        (out_dir / "keda.crt", issued.keda.cert_pem, 0o644),
        (out_dir / "keda.key", issued.keda.key_pem, 0o600),
        (out_dir / "apiservice-cabundle.yaml", apiservice_patch(issued.ca_pem).encode(), 0o644),
    ]
    for path, data, mode in files:
        _write(path, data, mode)
    return [path for path, _, _ in files]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--service", default="zeroscale-adapter", help="the adapter's Service (default: %(default)s)")
    parser.add_argument("--namespace", default="zeroscale", help="its namespace (default: %(default)s)")
    parser.add_argument("--days", type=int, default=365, help="validity in days (default: %(default)s)")
    parser.add_argument("--dns-name", action="append", default=[], help="another DNS name for the certificate")
    parser.add_argument(
        "--out-dir",
        type=Path,
        default=Path("deploy/overlays/certs/generated"),
        help="where ca.crt, tls.crt/.key (adapter), counts.crt/.key (proxies), keda.crt/.key (KEDA's client) "
        "and apiservice-cabundle.yaml go (default: %(default)s)",
    )


def run(args: argparse.Namespace) -> int:
    if args.days < 1:
        print("--days must be at least 1")
        return 2
    issued = issue(args.service, args.namespace, args.days, args.dns_name)
    for path in write(issued, args.out_dir):
        print(f"wrote {path}")
    print(
        f"certificates for {args.service}.{args.namespace}.svc, {COUNTS_SERVICE}.{args.namespace}.svc and "
        f"KEDA's client ({KEDA_CLIENT}), valid {args.days} days"
    )
    return 0
