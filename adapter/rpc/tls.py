"""Server credentials from certificate files, re-read when they change (new connections get the new pair).

gRPC asks `_fetch` on each TLS handshake; it looks at the files at most once per `reload_interval`
and hands gRPC a new configuration only when their size or modification time changed.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import grpc

from adapter.config.grpc import GRPCServerTLS
from adapter.telemetry import rpc as telemetry

log = logging.getLogger(__name__)


class TLSFilesError(OSError):
    """A certificate, key or CA file could not be read at start."""


def _signature(paths: list[Path]) -> tuple[tuple[int, int], ...]:
    stats = [os.stat(path) for path in paths]
    return tuple((stat.st_mtime_ns, stat.st_size) for stat in stats)


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

    def credentials(self) -> grpc.ServerCredentials:
        return grpc.dynamic_ssl_server_credentials(
            self._current,
            self._fetch,  # type: ignore[arg-type]  # None means "unchanged" (grpc's documented contract)
            require_client_authentication=self._config.client_ca_file is not None,
        )

    def _load(self) -> grpc.ServerCertificateConfiguration:
        config = self._config
        pair = (config.key_file.read_bytes(), config.cert_file.read_bytes())
        roots = config.client_ca_file.read_bytes() if config.client_ca_file is not None else None
        return grpc.ssl_server_certificate_configuration([pair], roots)

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
        except OSError as err:
            # Half-written files during a rotation: keep serving the previous pair and look again later.
            telemetry.GRPC_TLS_RELOADS.labels(self._server, "error").inc()
            log.warning("grpc.%s.tls: keeping the previous certificate: cannot read %s", self._server, err.filename)
            return None
        self._seen = seen
        self._current = fresh
        telemetry.GRPC_TLS_RELOADS.labels(self._server, "ok").inc()
        log.info("grpc.%s.tls: certificate files changed, new connections use them", self._server)
        return fresh
