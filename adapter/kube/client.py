"""A minimal async client for the few Kubernetes API calls Zeroscale makes.

Plain HTTP/1.1 (connection.py), a small pool of keep-alive connections for ordinary calls and one
dedicated connection per watch. Where the API server is and how to authenticate: kubeconfig.py.
"""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

from adapter import __version__
from adapter.config.kube import KubeAPIConfig
from adapter.kube.connection import ClosedBeforeAnswer, Connection, Exchange
from adapter.kube.errors import KubeAPIError, KubeConnectionError, KubeWatchSilent
from adapter.kube.kubeconfig import APIServer, TokenSource, resolve_api_server
from adapter.redact import redact
from adapter.telemetry import kube as telemetry

_POOL_SIZE = 8
_MAX_ERROR_TEXT = 512
# The API server is asked to end each watch after this share of the silence timeout (the caller lists and watches
# again): a quiet, healthy watch (no event; bookmarks come about once a minute, and one 2 s before the end asked
# for) ends on its own before it could be taken for silent; the rest is the margin for a server's lateness.
_SERVER_END_SHARE = 0.8
# One watch event (a JSON line) longer than this is refused: etcd stores objects of at most 1.5 MiB.
MAX_WATCH_EVENT_BYTES = 8 * 1024 * 1024
KEEPALIVE_IDLE, KEEPALIVE_INTERVAL = 15, 5


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
        server: APIServer,
        timeout: float = 10.0,
        peer: str = "the Kubernetes API",
        max_response_bytes: int | None = None,
        watch_silence: float = 30.0,
    ) -> None:
        """`peer` names the server in error messages; `max_response_bytes` bounds an answer (not a watch);
        `watch_silence` is how long a watch may send nothing before it is taken for dead."""
        self._server = server
        self._timeout = timeout
        self._watch_silence = watch_silence
        self._peer = peer
        self._max_response_bytes = max_response_bytes
        self._token = TokenSource(server)
        self._idle: list[Connection] = []

    @classmethod
    def from_config(cls, config: KubeAPIConfig) -> KubeClient:
        return cls(resolve_api_server(config), config.timeout, watch_silence=config.watch_silence_timeout)

    async def request(
        self,
        method: str,
        path: str,
        json_body: object = None,
        content_type: str = "application/json",
        secret: str | None = None,
        within: float | None = None,
    ) -> tuple[int, dict[str, Any]]:
        """Make one call; return (status, decoded JSON) for 2xx, raise KubeAPIError for >= 400.

        `secret` is a credential the body carries (a TokenReview's token): never in an error message.
        `within` shortens the client's timeout for this call (a write that must land by a deadline).
        """
        # A task of its own: asyncio.timeout needs one, and the API server runs a handler's first
        # step outside any task (adapter/api/http.py). Cancelling the caller cancels this task.
        return await asyncio.get_running_loop().create_task(
            self._request(method, path, json_body, content_type, secret, self._timeout if within is None else within)
        )

    async def _request(
        self, method: str, path: str, json_body: object, content_type: str, secret: str | None, within: float
    ) -> tuple[int, dict[str, Any]]:
        body = b"" if json_body is None else json.dumps(json_body).encode()
        within = min(within, self._timeout)
        try:
            async with asyncio.timeout(within):
                status, data = await self._exchange_with_retry(method, path, body, content_type)
        except TimeoutError:
            raise KubeConnectionError(f"{method} {path}: no answer from {self._peer} within {within:g}s") from None
        if status >= 400:
            raise _api_error(status, data, (secret, self._token.get()))
        try:
            decoded = json.loads(data) if data else {}
        except ValueError:
            raise KubeConnectionError(f"{method} {path}: {self._peer} answered {status} with non-JSON") from None
        if not isinstance(decoded, dict):
            raise KubeConnectionError(f"{method} {path}: {self._peer} answered {status} with a non-object")
        return status, decoded

    async def watch(
        self, path: str, resource_version: str | None = None, timeout_seconds: int | None = None
    ) -> AsyncIterator[dict[str, Any]]:
        """Yield the watch events ({"type", "object"}, BOOKMARK included) of a collection until the server ends the
        watch.

        Bookmarks are asked for (allowWatchBookmarks): the server then sends one about every minute even when
        nothing changes, and one just before the end. A stream that sends nothing for `watch_silence` seconds is
        taken for dead (KubeWatchSilent: an open connection proves nothing, docs/architecture.md#staleness-bounds);
        the server is asked to end the watch after `timeout_seconds` (by default a little less than that), and a
        stream still open `timeout` seconds after it is a peer that went away without closing (no FIN, no RST).
        Either way KubeConnectionError, so the caller lists and watches again instead of trusting it. An ERROR event
        (e.g. 410 Gone: the resourceVersion is too old) raises KubeAPIError, so the caller lists again and restarts.
        """
        silence = self._watch_silence
        if timeout_seconds is None:
            timeout_seconds = max(1, int(silence * _SERVER_END_SHARE))
        query = f"watch=1&allowWatchBookmarks=true&timeoutSeconds={timeout_seconds}" + (
            f"&resourceVersion={resource_version}" if resource_version else ""
        )
        full_path = f"{path}{'&' if '?' in path else '?'}{query}"
        loop = asyncio.get_running_loop()
        ends_by = loop.time() + timeout_seconds + self._timeout
        try:
            async with asyncio.timeout(self._timeout):
                connection = await self._connect()
        except TimeoutError:
            raise KubeConnectionError(f"watch {path}: cannot connect within {self._timeout:g}s") from None
        try:
            exchange = Exchange(connection, self._peer)
            try:
                async with asyncio.timeout(self._timeout):
                    self._send(connection, "GET", full_path, b"", "application/json")
                    status = await exchange.read_headers()
                    if status != 200:
                        raise _api_error(status, await exchange.read_body(), (self._token.get(),))
            except TimeoutError:
                raise KubeConnectionError(f"watch {path}: no answer within {self._timeout:g}s") from None
            except (OSError, ClosedBeforeAnswer) as err:
                raise KubeConnectionError(f"watch {path}: {err}") from None
            pending = b""
            heard = loop.time()  # the latest byte from the server
            while True:
                pending += exchange.response.take_body()
                *lines, pending = pending.split(b"\n")
                if len(pending) > MAX_WATCH_EVENT_BYTES:
                    raise KubeConnectionError(
                        f"watch {path}: {self._peer} sent an event longer than {MAX_WATCH_EVENT_BYTES} bytes"
                    )
                for line in lines:
                    if line.strip():
                        yield _watch_event(line)
                if exchange.response.complete:
                    return
                try:
                    async with asyncio.timeout_at(min(ends_by, heard + silence)):
                        if not await exchange.read_more():
                            return
                    heard = loop.time()
                except TimeoutError:
                    quiet = loop.time() - heard
                    # Nothing since the end it was asked for, or for the silence timeout: silent, whichever came first.
                    if quiet >= min(silence, timeout_seconds):
                        telemetry.WATCH_SILENCES.labels(_resource(path)).inc()
                        raise KubeWatchSilent(
                            f"watch {path}: {self._peer} sent nothing (no event, no bookmark) for {quiet:.0f}s: taken "
                            "for dead, listing again; if something in between holds quiet streams longer than "
                            f"kubernetes.watch_silence_timeout ({silence:g}s), raise it"
                        ) from None
                    raise KubeConnectionError(
                        f"watch {path}: still open {self._timeout:g}s after the {timeout_seconds}s the server "
                        "was asked to end it at: the connection is dead"
                    ) from None
                except OSError as err:
                    raise KubeConnectionError(f"watch {path}: {err}") from None
        finally:
            connection.close()

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()

    async def _connect(self) -> Connection:
        server = self._server
        try:
            reader, writer = await asyncio.open_connection(
                server.host,
                server.port,
                ssl=server.ssl,
                server_hostname=server.server_hostname if server.ssl else None,
            )
        except (OSError, ssl.SSLError) as err:
            raise KubeConnectionError(f"cannot connect to {self._peer} at {server.netloc}: {err}") from None
        _keep_alive(writer.get_extra_info("socket"))
        return Connection(reader, writer)

    def _send(self, connection: Connection, method: str, path: str, body: bytes, content_type: str) -> None:
        lines = [
            f"{method} {path} HTTP/1.1",
            f"Host: {self._server.netloc}",
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
                exchange = Exchange(connection, self._peer)
                self._send(connection, method, path, body, content_type)
                status = await exchange.read_headers()
                data = await exchange.read_body(self._max_response_bytes)
            except ClosedBeforeAnswer as err:
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


def _keep_alive(sock: socket.socket | None) -> None:
    """TCP keepalive probes, so a peer that vanished (no FIN, no RST) is noticed within about
    KEEPALIVE_IDLE + 3 * KEEPALIVE_INTERVAL seconds, not only when a watch outlives its deadline."""
    if sock is None:
        return
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    if hasattr(socket, "TCP_KEEPIDLE"):  # Linux; elsewhere the system's defaults apply
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, KEEPALIVE_IDLE)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, KEEPALIVE_INTERVAL)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3)


def _resource(path: str) -> str:
    """The resource a collection path names (`endpointslices` for .../endpointslices?labelSelector=...)."""
    return urlsplit(path).path.rstrip("/").rsplit("/", 1)[-1]


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
