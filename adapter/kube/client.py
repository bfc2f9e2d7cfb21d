"""A minimal async client for the few Kubernetes API calls Zeroscale makes.

Plain HTTP/1.1 over asyncio streams, responses parsed by httptools, a small pool of
keep-alive connections for ordinary calls and one dedicated connection per watch.
Where the API server is and how to authenticate come from `KubeAPIConfig`:

- `kubeconfig`: the file's current context (server, CA, client certificate and key as
  files or inline data, bearer token or token file);
- `url` plus `ca_file` / `token_file` / `client_cert_file` / `client_key_file`;
- neither: in cluster, `KUBERNETES_SERVICE_HOST`/`PORT` and the service-account token and
  CA under /var/run/secrets/kubernetes.io/serviceaccount.

Explicit `ca_file`, `token_file` and client certificate fields override the kubeconfig's.
Token files are re-read every minute: projected service-account tokens rotate.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import ssl
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httptools
import yaml

from adapter import __version__
from adapter.config.kube import SERVICE_ACCOUNT_DIR, KubeAPIConfig
from adapter.redact import redact

TOKEN_REREAD_SECONDS = 60.0
_POOL_SIZE = 8
_READ_SIZE = 65536
_MAX_ERROR_TEXT = 512


class KubeError(Exception):
    """Any failure talking to the Kubernetes API."""


class KubeConfigError(KubeError):
    """Where the API server is, or how to authenticate to it, could not be worked out."""


class KubeConnectionError(KubeError):
    """The API server could not be reached, or the connection broke before a whole answer."""


class KubeAPIError(KubeError):
    """The API server answered with an error; `message` and `reason` come from its metav1.Status."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class Endpoint:
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
        return f"Endpoint({self.scheme}://{self.host}:{self.port})"

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


def _from_kubeconfig(config: KubeAPIConfig, path: Path) -> Endpoint:
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
    return Endpoint(
        scheme,
        host,
        port,
        tls,
        cluster.get("tls-server-name") or host,
        token_file,
        token=None if token_file else user.get("token"),
    )


def resolve_endpoint(config: KubeAPIConfig) -> Endpoint:
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
    return Endpoint(scheme, host, port, tls, host, token_file)


class _TokenSource:
    """The bearer token, re-read from its file at most once a minute so rotated tokens are picked up."""

    def __init__(self, endpoint: Endpoint) -> None:
        self._file = endpoint.token_file
        self._token = endpoint.token
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


class _Response:
    """httptools callbacks collecting one response; the body is kept as a list of chunks."""

    def __init__(self) -> None:
        self.headers: dict[str, str] = {}
        self.headers_done = False
        self.complete = False
        self.chunks: list[bytes] = []
        self.size = 0  # body bytes received, whether or not taken
        self.received = False

    def on_message_begin(self) -> None:
        self.received = True

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.headers_done = True

    def on_body(self, body: bytes) -> None:
        self.size += len(body)
        self.chunks.append(body)

    def on_message_complete(self) -> None:
        self.complete = True

    def take_body(self) -> bytes:
        body = b"".join(self.chunks)
        self.chunks.clear()
        return body


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    def close(self) -> None:
        self.writer.close()


class _Exchange:
    """One request written on a connection and its response read as it arrives."""

    def __init__(self, connection: _Connection, peer: str = "the Kubernetes API") -> None:
        self.connection = connection
        self.peer = peer
        self.response = _Response()
        self.parser = httptools.HttpResponseParser(self.response)

    async def read_more(self) -> bool:
        """Feed the parser the next bytes; False when the peer closed the connection."""
        data = await self.connection.reader.read(_READ_SIZE)
        if not data:
            if not self.response.complete:
                with contextlib.suppress(httptools.HttpParserError):
                    self.parser.feed_data(b"")  # ends a body delimited by connection close
            return False
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as err:
            raise KubeConnectionError(f"malformed HTTP response from {self.peer}: {err}") from None
        return True

    async def read_headers(self) -> int:
        while not self.response.headers_done:
            if not await self.read_more():
                raise _ClosedBeforeAnswer(self.response.received, self.peer)
        status: int = self.parser.get_status_code()
        return status

    async def read_body(self, limit: int | None = None) -> bytes:
        """The whole body; KubeConnectionError once it passes `limit` bytes."""
        while not self.response.complete:
            if not await self.read_more() and not self.response.complete:
                raise KubeConnectionError(f"{self.peer} closed the connection in the middle of a response")
            if limit is not None and self.response.size > limit:
                raise ResponseTooLarge(f"{self.peer} answered with more than {limit} bytes")
        return self.response.take_body()


class ResponseTooLarge(KubeConnectionError):
    """An answer larger than the client's `max_response_bytes`."""


class _ClosedBeforeAnswer(Exception):
    def __init__(self, received: bool, peer: str) -> None:
        super().__init__(f"{peer} closed the connection before answering")
        self.received = received


def _api_error(status: int, body: bytes, secrets: tuple[str | None, ...]) -> KubeAPIError:
    """The error an answer >= 400 means. Its text may echo the request (a TokenReview's token, our
    Authorization header): it is redacted here, before any caller can log it."""
    try:
        document = json.loads(body)
    except ValueError:
        document = None
    if isinstance(document, dict) and document.get("kind") == "Status":
        message = redact(str(document.get("message", "")), secrets)
        return KubeAPIError(status, redact(str(document.get("reason", "")), secrets), message)
    text = redact(body[:_MAX_ERROR_TEXT].decode("utf-8", "replace").strip(), secrets)
    return KubeAPIError(status, "", text or "no message")


class KubeClient:
    """Calls the Kubernetes API. One per process; close() when done."""

    def __init__(
        self,
        endpoint: Endpoint,
        timeout: float = 10.0,
        peer: str = "the Kubernetes API",
        max_response_bytes: int | None = None,
    ) -> None:
        """`peer` names the server in error messages; `max_response_bytes` bounds an answer (not a watch)."""
        self._endpoint = endpoint
        self._timeout = timeout
        self._peer = peer
        self._max_response_bytes = max_response_bytes
        self._token = _TokenSource(endpoint)
        self._idle: list[_Connection] = []

    @classmethod
    def from_config(cls, config: KubeAPIConfig) -> KubeClient:
        return cls(resolve_endpoint(config), config.timeout)

    @property
    def endpoint(self) -> Endpoint:
        return self._endpoint

    async def request(
        self,
        method: str,
        path: str,
        json_body: object = None,
        content_type: str = "application/json",
        secret: str | None = None,
    ) -> tuple[int, dict[str, Any]]:
        """Make one call; return (status, decoded JSON) for 2xx, raise KubeAPIError for >= 400.

        `secret` is a credential the body carries (a TokenReview's token): never in an error message.
        """
        # A task of its own: asyncio.timeout needs one, and the API server runs a handler's first
        # step outside any task (adapter/api/http.py). Cancelling the caller cancels this task.
        return await asyncio.get_running_loop().create_task(
            self._request(method, path, json_body, content_type, secret)
        )

    async def _request(
        self, method: str, path: str, json_body: object, content_type: str, secret: str | None
    ) -> tuple[int, dict[str, Any]]:
        body = b"" if json_body is None else json.dumps(json_body).encode()
        try:
            async with asyncio.timeout(self._timeout):
                status, data = await self._exchange_with_retry(method, path, body, content_type)
        except TimeoutError:
            raise KubeConnectionError(
                f"{method} {path}: no answer from {self._peer} within {self._timeout:g}s"
            ) from None
        if status >= 400:
            raise _api_error(status, data, (secret, self._token.get()))
        try:
            decoded = json.loads(data) if data else {}
        except ValueError:
            raise KubeConnectionError(f"{method} {path}: {self._peer} answered {status} with non-JSON") from None
        if not isinstance(decoded, dict):
            raise KubeConnectionError(f"{method} {path}: {self._peer} answered {status} with a non-object")
        return status, decoded

    async def watch(self, path: str, resource_version: str | None = None) -> AsyncIterator[dict[str, Any]]:
        """Yield the watch events ({"type", "object"}) of a collection until the server ends the watch.

        An ERROR event (e.g. 410 Gone: the resourceVersion is too old) raises KubeAPIError,
        so the caller lists again and restarts the watch.
        """
        query = "watch=1" + (f"&resourceVersion={resource_version}" if resource_version else "")
        full_path = f"{path}{'&' if '?' in path else '?'}{query}"
        try:
            async with asyncio.timeout(self._timeout):
                connection = await self._connect()
        except TimeoutError:
            raise KubeConnectionError(f"watch {path}: cannot connect within {self._timeout:g}s") from None
        try:
            exchange = _Exchange(connection, self._peer)
            try:
                async with asyncio.timeout(self._timeout):
                    self._send(connection, "GET", full_path, b"", "application/json")
                    status = await exchange.read_headers()
                    if status != 200:
                        raise _api_error(status, await exchange.read_body(), (self._token.get(),))
            except TimeoutError:
                raise KubeConnectionError(f"watch {path}: no answer within {self._timeout:g}s") from None
            except (OSError, _ClosedBeforeAnswer) as err:
                raise KubeConnectionError(f"watch {path}: {err}") from None
            pending = b""
            while True:
                pending += exchange.response.take_body()
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    if line.strip():
                        yield _watch_event(line)
                if exchange.response.complete:
                    return
                try:
                    if not await exchange.read_more():
                        return
                except OSError as err:
                    raise KubeConnectionError(f"watch {path}: {err}") from None
        finally:
            connection.close()

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()

    async def _connect(self) -> _Connection:
        endpoint = self._endpoint
        try:
            reader, writer = await asyncio.open_connection(
                endpoint.host,
                endpoint.port,
                ssl=endpoint.ssl,
                server_hostname=endpoint.server_hostname if endpoint.ssl else None,
            )
        except (OSError, ssl.SSLError) as err:
            raise KubeConnectionError(f"cannot connect to {self._peer} at {endpoint.netloc}: {err}") from None
        return _Connection(reader, writer)

    def _send(self, connection: _Connection, method: str, path: str, body: bytes, content_type: str) -> None:
        lines = [
            f"{method} {path} HTTP/1.1",
            f"Host: {self._endpoint.netloc}",
            f"User-Agent: zeroscale/{__version__}",
            "Accept: application/json",
        ]
        token = self._token.get()
        if token:
            lines.append(f"Authorization: Bearer {token}")
        if body or method in ("POST", "PUT", "PATCH"):
            lines += [f"Content-Type: {content_type}", f"Content-Length: {len(body)}"]
        connection.writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)

    async def _exchange_with_retry(self, method: str, path: str, body: bytes, content_type: str) -> tuple[int, bytes]:
        # A pooled connection may have been closed by the server while idle; if it breaks
        # before any byte of an answer, the request never ran, so one retry on a new one is safe.
        while True:
            reused = bool(self._idle)
            connection = self._idle.pop() if reused else await self._connect()
            try:
                exchange = _Exchange(connection, self._peer)
                self._send(connection, method, path, body, content_type)
                status = await exchange.read_headers()
                data = await exchange.read_body(self._max_response_bytes)
            except _ClosedBeforeAnswer as err:
                connection.close()
                if reused and not err.received:
                    continue
                raise KubeConnectionError(f"{method} {path}: {err}") from None
            except (OSError, ssl.SSLError) as err:
                connection.close()
                if reused and not exchange.response.received:
                    continue
                raise KubeConnectionError(f"{method} {path}: {err}") from None
            except BaseException:
                connection.close()  # cancelled or timed out half-way: the connection's state is unknown
                raise
            if exchange.parser.should_keep_alive() and len(self._idle) < _POOL_SIZE:
                self._idle.append(connection)
            else:
                connection.close()
            return status, data


def _watch_event(line: bytes) -> dict[str, Any]:
    try:
        event = json.loads(line)
    except ValueError:
        raise KubeConnectionError("the Kubernetes API sent a watch event that is not JSON") from None
    if not isinstance(event, dict) or "type" not in event:
        raise KubeConnectionError("the Kubernetes API sent a watch event without a type")
    if event["type"] == "ERROR":
        status = event.get("object") or {}
        message = redact(str(status.get("message", "")))
        raise KubeAPIError(int(status.get("code", 500)), redact(str(status.get("reason", ""))), message)
    return event
