"""A real HTTP/1.1 upstream for the proxy tests, on a loopback port, in the test's event loop.

Paths choose the behaviour:
- `/echo...`: 200, body = the request body, headers `X-Seen-*` report what arrived (method, path,
  forwarded headers, framing); `?chunked=1` answers chunked, `?close=1` close-delimited; a HEAD
  request gets the head alone, unless `?head_body=1` (a broken upstream that sends the body too).
- `/slow?s=N`: answers after N seconds.
- `/crash`: sends half a response, then closes the connection.
- `/ws`: upgrades (101) and then echoes every byte back.
Every request is recorded in `requests` (method, path, headers, body), in arrival order, and every
byte received (outside tunnels) in `received`.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from urllib.parse import parse_qs, urlsplit

import httptools


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes = b""
    raw_headers: list[tuple[bytes, bytes]] = field(default_factory=list)


class _Conn(asyncio.Protocol):
    def __init__(self, app: Upstream) -> None:
        self.app = app
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self.current: Seen | None = None
        self.tunnel = False
        self.url = b""
        self.raw: list[tuple[bytes, bytes]] = []
        self.chunks: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.app.connections += 1
        self.app.open.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.app.open.discard(self)

    def data_received(self, data: bytes) -> None:
        if self.tunnel:
            self.transport.write(data)
            return
        self.app.received += data
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade as upgrade:
            self.tunnel = True
            rest = data[upgrade.args[0] :]
            if rest:
                self.transport.write(rest)
        except httptools.HttpParserError:
            self.transport.close()

    def on_message_begin(self) -> None:
        self.url = b""
        self.raw = []
        self.chunks = []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.raw.append((name, value))

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)

    def on_message_complete(self) -> None:
        headers = {n.decode().lower(): v.decode() for n, v in self.raw}
        seen = Seen(self.parser.get_method().decode(), self.url.decode(), headers, b"".join(self.chunks), self.raw)
        self.app.requests.append(seen)
        keep = self.parser.should_keep_alive()
        asyncio.get_running_loop().create_task(self.app.respond(self, seen, keep))


class Upstream:
    def __init__(self, port: int = 0) -> None:
        self.port = port
        self.requests: list[Seen] = []
        # Every byte received outside tunnels, over all connections.
        self.received = bytearray()
        self.connections = 0
        self.open: set[_Conn] = set()
        self._server: asyncio.Server | None = None

    async def start(self) -> Upstream:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Conn(self), "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for conn in list(self.open):
                conn.transport.abort()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)
            self._server = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def respond(self, conn: _Conn, seen: Seen, keep: bool) -> None:
        parts = urlsplit(seen.path)
        query = {k: v[0] for k, v in parse_qs(parts.query).items()}
        transport = conn.transport
        if parts.path == "/ws":
            transport.write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
            return
        if parts.path == "/crash":
            transport.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial")
            await asyncio.sleep(0.01)
            transport.abort()
            return
        if parts.path == "/slow":
            await asyncio.sleep(float(query.get("s", "1")))
        if transport.is_closing():
            return
        seen_headers = "".join(
            f"X-Seen-{name}: {seen.headers.get(name.lower(), '-')}\r\n"
            for name in ("X-Forwarded-For", "X-Forwarded-Proto", "X-Forwarded-Host", "Host", "Transfer-Encoding")
        )
        head = f"HTTP/1.1 200 OK\r\nX-Seen-Method: {seen.method}\r\nX-Seen-Path: {seen.path}\r\n{seen_headers}"
        body = seen.body
        if query.get("chunked"):
            half = len(body) // 2
            payload = b"".join(b"%x\r\n%b\r\n" % (len(p), p) for p in (body[:half], body[half:]) if p) + b"0\r\n\r\n"
            transport.write(head.encode() + b"Transfer-Encoding: chunked\r\n\r\n" + payload)
        elif query.get("close"):
            transport.write(head.encode() + b"Connection: close\r\n\r\n" + body)
            transport.close()
            return
        else:
            # A HEAD answer has the head a GET would get, and no body (RFC 9110 9.3.2).
            payload = b"" if seen.method == "HEAD" and not query.get("head_body") else body
            transport.write(head.encode() + b"Content-Length: %d\r\n\r\n" % len(body) + payload)
        if not keep:
            transport.close()
