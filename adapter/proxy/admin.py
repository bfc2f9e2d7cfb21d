"""The proxy's admin port: Prometheus metrics, liveness and readiness. One request per connection."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

_MAX_HEAD = 8192
_READ_TIMEOUT = 5.0


def _reply(status: str, content_type: str, body: bytes) -> bytes:
    return (
        f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode() + body


async def start_admin(host: str, port: int, ready: Callable[[], bool]) -> asyncio.Server:
    """Serve /metrics, /healthz and /readyz (503 once the proxy is draining)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(_READ_TIMEOUT):
                head = await reader.readuntil(b"\r\n\r\n")
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            writer.close()
            return
        parts = head.split(b" ", 2)
        path = parts[1].split(b"?", 1)[0] if len(parts) > 1 else b""
        if path == b"/metrics":
            response = _reply("200 OK", CONTENT_TYPE_LATEST, generate_latest())
        elif path in (b"/healthz", b"/livez"):
            response = _reply("200 OK", "text/plain", b"ok\n")
        elif path == b"/readyz":
            response = (
                _reply("200 OK", "text/plain", b"ok\n")
                if ready()
                else _reply("503 Service Unavailable", "text/plain", b"draining\n")
            )
        else:
            response = _reply("404 Not Found", "text/plain", b"not found\n")
        writer.write(response)
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        writer.close()

    return await asyncio.start_server(handle, host, port, limit=_MAX_HEAD)
