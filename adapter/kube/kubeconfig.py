"""Where the Kubernetes API server is and how to authenticate to it, from `KubeAPIConfig`:

- `kubeconfig`: the file's current context (server, CA, client certificate and key as
  files or inline data, bearer token or token file);
- `url` plus `ca_file` / `token_file` / `client_cert_file` / `client_key_file`;
- neither: in cluster, `KUBERNETES_SERVICE_HOST`/`PORT` and the service-account token and
  CA under /var/run/secrets/kubernetes.io/serviceaccount.

Explicit `ca_file`, `token_file` and client certificate fields override the kubeconfig's.
Token files are re-read every minute: projected service-account tokens rotate.
"""

from __future__ import annotations

import base64
import os
import ssl
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from adapter.config.kube import SERVICE_ACCOUNT_DIR, KubeAPIConfig
from adapter.kube.errors import KubeConfigError
from adapter.redact import redact

TOKEN_REREAD_SECONDS = 60.0


@dataclass(frozen=True)
class APIServer:
    """The resolved API server: base URL, TLS context and where the bearer token comes from."""

    scheme: str
    host: str
    port: int
    ssl: ssl.SSLContext | None
    server_hostname: str | None
    token_file: Path | None
    # A static token from a kubeconfig; excluded from repr so it is never logged.
    token: str | None = None

    def __repr__(self) -> str:
        return f"APIServer({self.scheme}://{self.host}:{self.port})"

    @property
    def netloc(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def client_tls_context(
    ca_file: Path | None,
    ca_data: bytes | None,
    cert: tuple[Path, Path] | None,
    cert_data: tuple[bytes, bytes] | None,
    insecure: bool,
) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if ca_data:
        context.load_verify_locations(cadata=ca_data.decode("ascii"))
    if insecure:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if cert is not None:
        context.load_cert_chain(str(cert[0]), str(cert[1]))
    elif cert_data is not None:
        # ssl loads client certificates only from files: write them to a private directory briefly.
        with tempfile.TemporaryDirectory(prefix="zeroscale-kube-") as private:
            cert_path, key_path = Path(private, "client.crt"), Path(private, "client.key")
            for path, data in ((cert_path, cert_data[0]), (key_path, cert_data[1])):
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "wb") as out:
                    out.write(data)
            context.load_cert_chain(str(cert_path), str(key_path))
    return context


def _split_url(url: str) -> tuple[str, str, int]:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise KubeConfigError(f"the Kubernetes API URL {redact(url)!r} must be http(s)://host[:port]")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return parts.scheme, parts.hostname, port


def _from_kubeconfig(config: KubeAPIConfig, path: Path) -> APIServer:
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as err:
        # A YAML error quotes the line it stopped at, which may hold a token.
        raise KubeConfigError(f"{path}: cannot read the kubeconfig: {redact(str(err))}") from None

    def named(section: str, name: str) -> dict[str, Any]:
        for entry in document.get(section) or []:
            if entry.get("name") == name:
                found: dict[str, Any] = entry.get(section[:-1]) or {}
                return found
        raise KubeConfigError(f"{path}: no entry named {name!r} under {section}")

    current = document.get("current-context")
    if not current:
        raise KubeConfigError(f"{path}: no current-context")
    context = named("contexts", current)
    cluster = named("clusters", context.get("cluster", ""))
    user = named("users", context["user"]) if context.get("user") else {}

    def file_of(entry: dict[str, Any], key: str) -> Path | None:
        value = entry.get(key)
        return (path.parent / value) if value else None

    def data_of(entry: dict[str, Any], key: str) -> bytes | None:
        value = entry.get(key)
        return base64.b64decode(value) if value else None

    server = cluster.get("server")
    if not server:
        raise KubeConfigError(f"{path}: cluster {context.get('cluster')!r} has no server")
    scheme, host, port = _split_url(server)
    cert_file = config.client_cert_file or file_of(user, "client-certificate")
    key_file = config.client_key_file or file_of(user, "client-key")
    cert_data = (data_of(user, "client-certificate-data"), data_of(user, "client-key-data"))
    tls = None
    if scheme == "https":
        tls = client_tls_context(
            config.ca_file or file_of(cluster, "certificate-authority"),
            None if config.ca_file else data_of(cluster, "certificate-authority-data"),
            (cert_file, key_file) if cert_file and key_file else None,
            cert_data if cert_data[0] and cert_data[1] else None,  # type: ignore[arg-type]
            bool(cluster.get("insecure-skip-tls-verify")),
        )
    token_file = config.token_file or file_of(user, "tokenFile")
    return APIServer(
        scheme,
        host,
        port,
        tls,
        cluster.get("tls-server-name") or host,
        token_file,
        token=None if token_file else user.get("token"),
    )


def resolve_api_server(config: KubeAPIConfig) -> APIServer:
    """Where the API server is and how to authenticate, per the module docstring; raise KubeConfigError."""
    if config.kubeconfig is not None:
        return _from_kubeconfig(config, config.kubeconfig)
    if config.url is not None:
        url, ca_file, token_file = config.url, config.ca_file, config.token_file
    else:
        service_host = os.environ.get("KUBERNETES_SERVICE_HOST")
        service_port = os.environ.get("KUBERNETES_SERVICE_PORT")
        if not service_host or not service_port:
            raise KubeConfigError(
                "not in a cluster (KUBERNETES_SERVICE_HOST/PORT unset): set kubernetes.kubeconfig or kubernetes.url"
            )
        bracketed = f"[{service_host}]" if ":" in service_host else service_host
        url = f"https://{bracketed}:{service_port}"
        ca_file = config.ca_file or SERVICE_ACCOUNT_DIR / "ca.crt"
        token_file = config.token_file or SERVICE_ACCOUNT_DIR / "token"
    scheme, host, port = _split_url(url)
    cert = (
        (config.client_cert_file, config.client_key_file)
        if config.client_cert_file and config.client_key_file
        else None
    )
    tls = client_tls_context(ca_file, None, cert, None, False) if scheme == "https" else None
    return APIServer(scheme, host, port, tls, host, token_file)


class TokenSource:
    """The bearer token, re-read from its file at most once a minute so rotated tokens are picked up."""

    def __init__(self, server: APIServer) -> None:
        self._file = server.token_file
        self._token = server.token
        self._read_at = -TOKEN_REREAD_SECONDS

    def get(self) -> str | None:
        if self._file is not None and time.monotonic() - self._read_at >= TOKEN_REREAD_SECONDS:
            try:
                self._token = self._file.read_text(encoding="utf-8").strip() or None
            except OSError as err:
                if self._token is None:
                    raise KubeConfigError(f"cannot read the token file {self._file}: {err.strerror}") from None
                # Keep the previous token: a rotation briefly replaces the file.
            self._read_at = time.monotonic()
        return self._token
