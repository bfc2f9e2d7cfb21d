"""zeroscale_certificate_expiry_timestamp_seconds: the serving certificate's notAfter, for the expiry alert
(deploy/helm/zeroscale/files/prometheus-rules.yaml), kept true across reloads, for the API and the gRPC servers."""

from __future__ import annotations

import datetime
import os
from pathlib import Path

import trustme
from prometheus_client import REGISTRY

from adapter.api.tls import ServingTLS
from adapter.config.grpc import GRPCServerTLS
from adapter.config.server import ServingTLSConfig
from adapter.rpc.tls import ReloadingServerCredentials

SOON = datetime.datetime(2031, 5, 1, 12, 0, tzinfo=datetime.UTC)
LATER = datetime.datetime(2032, 7, 1, 12, 0, tzinfo=datetime.UTC)


def expiry(tls: str) -> float | None:
    return REGISTRY.get_sample_value("zeroscale_certificate_expiry_timestamp_seconds", {"tls": tls})


def write_pair(ca: trustme.CA, directory: Path, not_after: datetime.datetime) -> tuple[Path, Path]:
    """A leaf expiring at `not_after`, with the CA's certificate after it (a chain: the earliest notAfter counts)."""
    leaf = ca.issue_cert("127.0.0.1", not_after=not_after)
    cert, key = directory / "tls.crt", directory / "tls.key"
    cert.write_bytes(b"".join(blob.bytes() for blob in leaf.cert_chain_pems) + ca.cert_pem.bytes())
    leaf.private_key_pem.write_to_path(str(key))
    return cert, key


def test_the_api_reports_its_certificates_expiry_and_a_reloaded_ones(tmp_path: Path) -> None:
    ca = trustme.CA()
    cert, key = write_pair(ca, tmp_path, SOON)
    tls = ServingTLS(ServingTLSConfig(cert_file=cert, key_file=key), verify_clients=False)
    assert expiry("server.tls") == SOON.timestamp()
    write_pair(ca, tmp_path, LATER)
    os.utime(cert, ns=(0, 0))  # a rewrite within the same mtime tick still reads as changed
    assert tls.reload_if_changed()
    assert expiry("server.tls") == LATER.timestamp()


def test_a_self_signed_api_certificate_reports_its_year(tmp_path: Path) -> None:
    ServingTLS(ServingTLSConfig(), verify_clients=False)
    left = (expiry("server.tls") or 0) - datetime.datetime.now(datetime.UTC).timestamp()
    assert 364 * 86400 < left <= 365 * 86400


def test_the_grpc_servers_report_their_certificates_expiry(tmp_path: Path) -> None:
    cert, key = write_pair(trustme.CA(), tmp_path, SOON)
    ReloadingServerCredentials(GRPCServerTLS(cert_file=cert, key_file=key), "scaler")
    assert expiry("grpc.scaler.tls") == SOON.timestamp()
