"""HTTP/2 clients for the attack tests: `RawPeer` writes frames as an attacker would (hyperframe frames, header
blocks encoded with hpack) and reads back what the proxy sends, frame by frame; `h2_get` is a well-behaved client
(h2's own client connection) asking one request, the bystander that must stay unaffected."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable

import h2.config
import h2.connection
import h2.events
import hpack
from hyperframe.frame import Frame, GoAwayFrame, HeadersFrame, RstStreamFrame, SettingsFrame

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def request_fields(path: str = "/echo", method: str = "GET", authority: str = "app.example") -> list[tuple[str, str]]:
    return [(":method", method), (":scheme", "http"), (":authority", authority), (":path", path)]


class RawPeer:
    """One connection to the proxy that has sent the preface and its SETTINGS, and writes whatever it is told."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.encoder = hpack.Encoder()
        self.decoder = hpack.Decoder()
        self.received: list[Frame] = []
        # Each stream's header blocks received (a response head, trailers), decoded in order.
        self.heads: dict[int, list[dict[bytes, bytes]]] = {}
        self.eof = False
        self._buffer = bytearray()

    @classmethod
    async def connect(cls, port: int, settings: dict[int, int] | None = None) -> RawPeer:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        peer = cls(reader, writer)
        peer.write(PREFACE + SettingsFrame(0, settings or {}).serialize())
        return peer

    def write(self, data: bytes) -> None:
        self.writer.write(data)

    def send(self, *frames: Frame) -> None:
        self.write(b"".join(frame.serialize() for frame in frames))

    def block(self, fields: Iterable[tuple[str, str]]) -> bytes:
        """A header block: the fields HPACK-encoded with this connection's encoder (its dynamic table)."""
        return bytes(self.encoder.encode(list(fields)))

    def headers(
        self,
        stream_id: int,
        path: str = "/echo",
        *,
        end_stream: bool = True,
        method: str = "GET",
        priority: bool = False,
    ) -> bytes:
        """A whole request head on `stream_id`, serialized (`priority`: with a PRIORITY flag and weight, as
        nghttp2's client and browsers send every request)."""
        frame = HeadersFrame(stream_id, self.block(request_fields(path, method)), depends_on=0, stream_weight=15)
        frame.flags.add("END_HEADERS")
        if end_stream:
            frame.flags.add("END_STREAM")
        if priority:
            frame.flags.add("PRIORITY")
        return frame.serialize()

    async def drain(self) -> bool:
        """Flush what was written; False when the proxy has closed the connection."""
        try:
            await self.writer.drain()
        except ConnectionError:
            return False
        return True

    async def next_frame(self) -> Frame | None:
        """The next frame the proxy sent (None: the connection ended)."""
        while True:
            if len(self._buffer) >= 9:
                frame, length = Frame.parse_frame_header(memoryview(self._buffer[:9]))
                if len(self._buffer) >= 9 + length:
                    frame.parse_body(memoryview(self._buffer[9 : 9 + length]))
                    del self._buffer[: 9 + length]
                    # RFC 9113 3.4: the server's preface is a SETTINGS frame, whatever it says next.
                    assert self.received or isinstance(frame, SettingsFrame), frame
                    if isinstance(frame, HeadersFrame):  # the proxy's blocks fit one frame
                        fields = self.decoder.decode(frame.data, raw=True)
                        self.heads.setdefault(frame.stream_id, []).append(dict(fields))
                    self.received.append(frame)
                    return frame
            if self.eof:
                return None
            try:
                data = await self.reader.read(65536)
            except ConnectionError:
                data = b""
            if not data:
                self.eof = True
            self._buffer += data

    async def until(self, wanted: Callable[[Frame], bool], within: float) -> Frame | None:
        """Read frames until one is `wanted` (returned) or the connection ends (None), within `within` seconds."""
        async with asyncio.timeout(within):
            while (frame := await self.next_frame()) is not None:
                if wanted(frame):
                    return frame
        return None

    async def goaway(self, within: float) -> GoAwayFrame:
        frame = await self.until(lambda f: isinstance(f, GoAwayFrame), within)
        assert isinstance(frame, GoAwayFrame), [type(f).__name__ for f in self.received]
        return frame

    async def reset(self, stream_id: int, within: float) -> RstStreamFrame:
        frame = await self.until(lambda f: isinstance(f, RstStreamFrame) and f.stream_id == stream_id, within)
        assert isinstance(frame, RstStreamFrame), [type(f).__name__ for f in self.received]
        return frame

    async def closed(self, within: float) -> float:
        """Seconds until the proxy closed the connection (every frame before the end is kept in `received`)."""
        start = time.monotonic()
        await self.until(lambda _f: False, within)
        return time.monotonic() - start

    def close(self) -> None:
        self.writer.close()


async def h2_get(port: int, path: str = "/echo", within: float = 5.0) -> tuple[int, bytes]:
    """One GET over a new prior-knowledge HTTP/2 connection, by h2's client: (status, body)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
    conn.initiate_connection()
    conn.send_headers(1, request_fields(path), end_stream=True)
    writer.write(conn.data_to_send())
    status, body = 0, bytearray()
    try:
        async with asyncio.timeout(within):
            while True:
                data = await reader.read(65536)
                assert data, f"the connection closed before the response ({status})"
                for event in conn.receive_data(data):
                    if isinstance(event, h2.events.ResponseReceived):
                        status = int(dict(event.headers or [])[b":status"])
                    elif isinstance(event, h2.events.DataReceived):
                        body += event.data or b""
                        conn.acknowledge_received_data(event.flow_controlled_length or 0, 1)
                    elif isinstance(event, h2.events.StreamEnded):
                        return status, bytes(body)
                    elif isinstance(event, h2.events.StreamReset):
                        raise AssertionError(f"stream reset: {event.error_code!r}")
                writer.write(conn.data_to_send())
    finally:
        with contextlib.suppress(Exception):
            writer.close()
