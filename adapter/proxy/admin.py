"""The proxy's admin port: Prometheus metrics, liveness and readiness. One request per connection.

Unauthenticated (metrics carry no secrets; the port belongs on a cluster-internal address), so it is
bounded like the proxy port: at most `admin_max_connections` at once, and each connection gets
_DEADLINE seconds in all, to send its request and to read the answer.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from adapter.telemetry import proxy as telemetry
from adapter.telemetry.exposition import negotiate

_MAX_HEAD = 8192
_DEADLINE = 5.0


def _reply(status: str, content_type: str, body: bytes) -> bytes:
    return (
        f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode() + body


def _accept(head: bytes) -> str | None:
    """The request's first `Accept` header (the head is at most _MAX_HEAD bytes)."""
    for line in head.split(b"\r\n")[1:]:
        name, colon, value = line.partition(b":")
        if colon and name.strip().lower() == b"accept":
            return value.strip().decode("latin-1")
    return None


def _answer(head: bytes, ready: Callable[[], bool]) -> bytes:
    parts = head.split(b" ", 2)
    path = parts[1].split(b"?", 1)[0] if len(parts) > 1 else b""
    if path == b"/metrics":
        page = negotiate(_accept(head))  # OpenMetrics (with the exemplars) for Prometheus, else the classic format
        return _reply("200 OK", page.content_type, page.render())
    if path in (b"/healthz", b"/livez"):
        return _reply("200 OK", "text/plain", b"ok\n")
    if path == b"/readyz":
        if ready():
            return _reply("200 OK", "text/plain", b"ok\n")
        return _reply("503 Service Unavailable", "text/plain", b"draining\n")
    return _reply("404 Not Found", "text/plain", b"not found\n")


async def start_admin(host: str, port: int, ready: Callable[[], bool], max_connections: int) -> asyncio.Server:
    """Serve /metrics, /healthz and /readyz (503 once the proxy is draining)."""
    open_connections = 0
    refused = telemetry.LIMIT_HITS.labels("", "admin_max_connections")

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal open_connections
        if open_connections >= max_connections:
            refused.inc()
            writer.transport.abort()
            return
        open_connections += 1
        try:
            async with asyncio.timeout(_DEADLINE):
                head = await reader.readuntil(b"\r\n\r\n")
                writer.write(_answer(head, ready))
                await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            writer.transport.abort()
        finally:
            open_connections -= 1
            with contextlib.suppress(ConnectionError):
                writer.close()

    return await asyncio.start_server(handle, host, port, limit=_MAX_HEAD)
