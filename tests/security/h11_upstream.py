"""An upstream that reads what the proxy sends with h11, a parser independent of the proxy's own (llhttp).

It records every request h11 sees, per connection, and every protocol error h11 finds (a proxy that
forwards what h11 cannot parse, or parses differently, is what request smuggling is made of). It answers
200 with the request body, or, when `reply` is set, with the raw bytes `reply` returns: a stand-in for a
broken or hostile upstream, whose bytes the test chooses exactly.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field

import h11


@dataclass
class Received:
    connection: int
    method: bytes
    target: bytes
    headers: list[tuple[bytes, bytes]]
    body: bytes = b""

    def header(self, name: bytes) -> list[bytes]:
        return [value for key, value in self.headers if key == name]


@dataclass
class H11Upstream:
    # Raw bytes to answer a request with (None: a normal 200 echoing the body); the connection stays open.
    reply: Callable[[Received], bytes] | None = None
    requests: list[Received] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    connections: int = 0
    # The numbers of the connections still open (the ones the proxy closed have been seen to end).
    open: set[int] = field(default_factory=set)
    port: int = 0
    _server: asyncio.Server | None = None
    _writers: set[asyncio.StreamWriter] = field(default_factory=set)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> H11Upstream:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for writer in list(self._writers):
                writer.transport.abort()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        number = self.connections
        self._writers.add(writer)
        self.open.add(number)
        connection = h11.Connection(h11.SERVER)
        current: Received | None = None
        try:
            while True:
                event = connection.next_event()
                if event is h11.NEED_DATA:
                    data = await reader.read(65536)
                    connection.receive_data(data)
                    if not data and connection.their_state is not h11.DONE:
                        return
                    continue
                if event is h11.PAUSED or isinstance(event, h11.ConnectionClosed):
                    return
                if isinstance(event, h11.Request):
                    current = Received(number, event.method, event.target, list(event.headers))
                elif isinstance(event, h11.Data) and current is not None:
                    current.body += event.data
                elif isinstance(event, h11.EndOfMessage) and current is not None:
                    self.requests.append(current)
                    self._answer(connection, writer, current)
                    if connection.our_state is h11.MUST_CLOSE or connection.their_state is h11.MUST_CLOSE:
                        return
                    connection.start_next_cycle()
                    current = None
        except h11.RemoteProtocolError as err:
            self.errors.append(f"connection {number}: {err}")
        except ConnectionError:
            pass
        finally:
            self._writers.discard(writer)
            self.open.discard(number)
            writer.close()

    def _answer(self, connection: h11.Connection, writer: asyncio.StreamWriter, request: Received) -> None:
        response = h11.Response(status_code=200, headers=[("Content-Length", str(len(request.body)))])
        data = connection.send(response) + connection.send(h11.Data(data=request.body))
        data += connection.send(h11.EndOfMessage())
        # A scripted reply replaces the bytes; h11 was still told a response went, to read the next request.
        writer.write(self.reply(request) if self.reply is not None else data)
