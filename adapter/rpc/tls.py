"""Server credentials from certificate files, re-read when they change (new connections get the new pair).

gRPC asks `_fetch` on each TLS handshake; it looks at the files at most once per `reload_interval`
and hands gRPC a new configuration only when their size or modification time changed and the new
files make a usable pair: gRPC itself would take a broken one without a word and fail every
handshake after it, so a truncated certificate or a key that does not match keeps the previous pair.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from adapter.config.grpc import GRPCServerTLS
from adapter.telemetry import certificates
from adapter.telemetry import rpc as telemetry

log = logging.getLogger(__name__)


class TLSFilesError(OSError):
    """A certificate, key or CA file could not be read or does not make a usable pair at start."""


class BrokenPair(ValueError):
    """The files were read but are not a certificate chain, its matching key and (optionally) CAs."""


def _signature(paths: list[Path]) -> tuple[tuple[int, int], ...]:
    stats = [os.stat(path) for path in paths]
    return tuple((stat.st_mtime_ns, stat.st_size) for stat in stats)


def check_pair(cert_pem: bytes, key_pem: bytes, ca_pem: bytes | None) -> None:
    """Raise BrokenPair unless `cert_pem` is a chain whose first certificate `key_pem` is the key of."""
    try:
        chain = x509.load_pem_x509_certificates(cert_pem)
        key = serialization.load_pem_private_key(key_pem, password=None)
        if ca_pem is not None:
            x509.load_pem_x509_certificates(ca_pem)
    except (ValueError, TypeError) as err:
        raise BrokenPair(str(err) or type(err).__name__) from None
    public = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    if chain[0].public_key().public_bytes(*public) != key.public_key().public_bytes(*public):
        raise BrokenPair("the key does not belong to the certificate")


class ReloadingServerCredentials:
    def __init__(self, config: GRPCServerTLS, server: str) -> None:
        self._config = config
        self._server = server
        self._paths = [config.cert_file, config.key_file]
        if config.client_ca_file is not None:
            self._paths.append(config.client_ca_file)
        self._checked_at = time.monotonic()
        try:
            self._seen = _signature(self._paths)
            self._current = self._load()
        except OSError as err:
            raise TLSFilesError(f"grpc.{server}.tls: cannot read {err.filename}: {err.strerror}") from None
        except BrokenPair as err:
            raise TLSFilesError(f"grpc.{server}.tls: {config.cert_file} / {config.key_file}: {err}") from None

    def credentials(self) -> grpc.ServerCredentials:
        return grpc.dynamic_ssl_server_credentials(
            self._current,
            self._fetch,  # type: ignore[arg-type]  # None means "unchanged" (grpc's documented contract)
            require_client_authentication=self._config.client_ca_file is not None,
        )

    def _load(self) -> grpc.ServerCertificateConfiguration:
        config = self._config
        cert, key = config.cert_file.read_bytes(), config.key_file.read_bytes()
        roots = config.client_ca_file.read_bytes() if config.client_ca_file is not None else None
        check_pair(cert, key, roots)
        certificates.record(f"grpc.{self._server}.tls", cert)  # in use from here: _load's answer is taken at once
        return grpc.ssl_server_certificate_configuration([(key, cert)], roots)

    def _fetch(self) -> grpc.ServerCertificateConfiguration | None:
        now = time.monotonic()
        if now - self._checked_at < self._config.reload_interval:
            return None
        self._checked_at = now
        try:
            seen = _signature(self._paths)
            if seen == self._seen:
                return None
            fresh = self._load()
        except (OSError, BrokenPair) as err:
            # Often a rotation caught half-way (new cert, old key): keep the previous pair, look again later.
            reason = f"cannot read {err.filename}" if isinstance(err, OSError) else str(err)
            telemetry.GRPC_TLS_RELOADS.labels(self._server, "error").inc()
            log.warning(
                "grpc.%s.tls: certificate files changed but cannot be used yet, keeping the previous pair: %s",
                self._server,
                reason,
            )
            return None
        self._seen = seen
        self._current = fresh
        telemetry.GRPC_TLS_RELOADS.labels(self._server, "ok").inc()
        log.info("grpc.%s.tls: certificate files changed, new connections use them", self._server)
        return fresh
