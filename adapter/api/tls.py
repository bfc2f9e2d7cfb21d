"""Serving TLS: certificate files reloaded when they change, or a self-signed pair made at start.

The listener keeps one SSLContext for its whole life; its `sni_callback` runs early in every
handshake and moves the connection to the newest context. So a rotated certificate, or a
rotated client CA bundle (from files or the authentication ConfigMap), applies to the next
handshake without restarting the listener. Contexts accept TLS 1.2 or newer only.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import logging
import os
import ssl
import tempfile
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from adapter.certs import builder, key_pem, x509_name
from adapter.config.server import ServingTLSConfig
from adapter.telemetry import api as telemetry
from adapter.telemetry import certificates

log = logging.getLogger(__name__)

_MIN_VERSIONS = {"1.2": ssl.TLSVersion.TLSv1_2, "1.3": ssl.TLSVersion.TLSv1_3}


class TLSError(Exception):
    """The serving certificate could not be loaded."""


def self_signed(sans: list[str]) -> tuple[bytes, bytes]:
    """A self-signed certificate and key (PEM) for the given DNS names and IP addresses."""
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = []
    for san in sans:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(san)))
        except ValueError:
            names.append(x509.DNSName(san))
    subject = x509_name(sans[0] if sans else "zeroscale")
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        builder(subject, subject, key, now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=365))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(key, hashes.SHA256())
    )
    return certificate.public_bytes(serialization.Encoding.PEM), key_pem(key)


def file_state(path: Path) -> tuple[int, int, int] | None:
    """What changes when a file is rewritten or replaced (mtime, size, inode); None when it cannot be read."""
    try:
        stat = path.stat()
    except OSError:
        return None
    return stat.st_mtime_ns, stat.st_size, stat.st_ino


class ServingTLS:
    """The newest serving SSLContext, and the listener context that hands handshakes to it."""

    def __init__(self, config: ServingTLSConfig, verify_clients: bool) -> None:
        if (config.cert_file is None) != (config.key_file is None):
            raise TLSError("server.tls: set both cert_file and key_file, or neither (self-signed)")
        self._config = config
        self._verify_clients = verify_clients
        self._client_cas = b""
        self._self_signed = None if config.cert_file else self_signed(config.self_signed_sans)
        self._files_seen = self._files_state()
        self._listener = self._build()
        self._listener.sni_callback = self._choose_context
        self._current = self._listener
        self._record_expiry()

    @property
    def listener_context(self) -> ssl.SSLContext:
        return self._listener

    def set_client_cas(self, pem: bytes) -> None:
        """Trust these CAs for client certificates from the next handshake on."""
        if pem == self._client_cas:
            return
        previous, self._client_cas = self._client_cas, pem
        try:
            self._current = self._build()
        except (TLSError, ssl.SSLError) as err:
            self._client_cas = previous
            telemetry.TLS_RELOADS.labels("client-cas", "failure").inc()
            log.error("new client CA bundle refused, keeping the previous one: %s", err)
            return
        telemetry.TLS_RELOADS.labels("client-cas", "success").inc()
        log.info("trusted client CAs updated")

    def reload_if_changed(self) -> bool:
        """Load the certificate files again if they changed on disk; True when a new pair is in use."""
        state = self._files_state()
        if self._self_signed is not None or state == self._files_seen:
            return False
        try:
            context = self._build()
        except (TLSError, ssl.SSLError) as err:
            # Often a rotation caught half-way (new cert, old key): the next poll retries.
            telemetry.TLS_RELOADS.labels("serving-certificate", "failure").inc()
            log.warning("serving certificate changed but cannot be loaded yet, keeping the previous one: %s", err)
            return False
        self._files_seen = state
        self._current = context
        self._record_expiry()
        telemetry.TLS_RELOADS.labels("serving-certificate", "success").inc()
        log.info("serving certificate reloaded from %s", self._config.cert_file)
        return True

    def _record_expiry(self) -> None:
        """The expiry of the pair in use (the files read again: a rotation between the load and this read is seen at
        the next poll, as the files changed)."""
        if self._self_signed is not None:
            certificates.record("server.tls", self._self_signed[0])
        elif self._config.cert_file is not None:
            with contextlib.suppress(OSError, ValueError):
                certificates.record("server.tls", self._config.cert_file.read_bytes())

    def _files_state(self) -> tuple[object, ...]:
        config = self._config
        return tuple(file_state(path) for path in (config.cert_file, config.key_file) if path is not None)

    def _choose_context(
        self, ssl_object: ssl.SSLObject | ssl.SSLSocket, server_name: str | None, _base: object
    ) -> None:
        if ssl_object.context is not self._current:
            ssl_object.context = self._current

    def _build(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = _MIN_VERSIONS[self._config.min_version]
        context.set_alpn_protocols(["http/1.1"])
        if self._self_signed is not None:
            self._load_pem_pair(context, *self._self_signed)
        else:
            assert self._config.cert_file is not None
            assert self._config.key_file is not None
            try:
                context.load_cert_chain(self._config.cert_file, self._config.key_file)
            except (OSError, ssl.SSLError) as err:
                raise TLSError(f"cannot load {self._config.cert_file} / {self._config.key_file}: {err}") from None
        if self._verify_clients:
            # Always ask for a certificate, even before any CA is known: the verify mode of a
            # connection is fixed by the listener context, only the trusted CAs follow the swap.
            context.verify_mode = ssl.CERT_OPTIONAL
            if self._client_cas:
                context.load_verify_locations(cadata=self._client_cas.decode("ascii"))
        return context

    @staticmethod
    def _load_pem_pair(context: ssl.SSLContext, cert_pem: bytes, key_pem: bytes) -> None:
        # ssl loads a certificate chain only from files: write the generated pair privately, briefly.
        with tempfile.TemporaryDirectory(prefix="zeroscale-tls-") as private:
            cert_path, key_path = Path(private, "tls.crt"), Path(private, "tls.key")
            for path, data in ((cert_path, cert_pem), (key_path, key_pem)):
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "wb") as out:
                    out.write(data)
            context.load_cert_chain(cert_path, key_path)
