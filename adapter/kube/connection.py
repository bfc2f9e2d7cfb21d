"""One HTTP/1.1 connection to the Kubernetes API over asyncio streams, and one request's answer read on it
with httptools. The calls themselves, the pool and the retry are in client.py."""

from __future__ import annotations

import asyncio
import contextlib

import httptools

from adapter.kube.errors import KubeConnectionError, ResponseTooLarge

_READ_SIZE = 65536


class ResponseParts:
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


class Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    def close(self) -> None:
        self.writer.close()


class Exchange:
    """One request written on a connection and its response read as it arrives."""

    def __init__(self, connection: Connection, peer: str = "the Kubernetes API") -> None:
        self.connection = connection
        self.peer = peer
        self.response = ResponseParts()
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
                raise ClosedBeforeAnswer(self.response.received, self.peer)
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


class ClosedBeforeAnswer(Exception):
    def __init__(self, received: bool, peer: str) -> None:
        super().__init__(f"{peer} closed the connection before answering")
        self.received = received
