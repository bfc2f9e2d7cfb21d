"""When the serving certificates in use stop being valid: set at start and at each reload that took, so an alert
can say "renew it" days before clients start failing their handshakes."""

from __future__ import annotations

from cryptography import x509
from prometheus_client import Gauge

EXPIRY = Gauge(
    "zeroscale_certificate_expiry_timestamp_seconds",
    "Unix time the serving certificate in use stops being valid (the earliest notAfter of its chain), by the config "
    "section that names its files (server.tls, grpc.scaler.tls, grpc.counts.tls): renew the files before then",
    ["tls"],
)


def record(tls: str, chain_pem: bytes) -> None:
    """The chain `tls` serves from now on (PEM, leaf first): an intermediate that expires first fails clients
    first."""
    chain = x509.load_pem_x509_certificates(chain_pem)
    EXPIRY.labels(tls).set(min(certificate.not_valid_after_utc.timestamp() for certificate in chain))
