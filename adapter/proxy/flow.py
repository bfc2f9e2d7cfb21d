"""Bytes and back-pressure between one client connection and the upstream connection serving it.

One `Flow` per client connection, paired with at most one upstream connection at a time (the one
attached to the request being served, or the tunnel). Everything that crosses between the two sides
goes through it: the forwarded request and response bytes, a tunnel's bytes (counted, so the sweeper
sees a tunnel moving), and the pauses of a side whose peer reads too slowly. Neither protocol touches
the other's transport or flags.

    client transport  <-- to_client / relay_to_client ---  UpstreamConnection
    ClientConnection, Exchange  --- pair / to_upstream / relay_to_upstream -->  upstream transport
    client too slow (its pause_writing)   -> client_slow: upstream reading paused, until client_ready/unpair
    upstream too slow (its pause_writing) -> upstream_slow: client reading paused, until upstream_ready

An HTTP/2 upstream (an h2upstream.H2UpstreamStream, its own transport) reports its response as fields and DATA
(`response`, `data`, `end`): written here in HTTP/1.1, the client's protocol (h2wire.h1_response_head).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from adapter.proxy.h2wire import Fields, chunk_end, h1_response_head
from adapter.proxy.http1 import chunk

if TYPE_CHECKING:
    from adapter.proxy.client import ClientConnection
    from adapter.proxy.exchange import Exchange
    from adapter.proxy.h2upstream import H2UpstreamStream
    from adapter.proxy.upstream import UpstreamConnection


class Pairing:
    """The upstream side serving a client side, and whether its reading is paused for a slow client: the part of a
    flow both protocols' client sides share (`Flow`, and h2client.H2Stream for one HTTP/2 stream)."""

    __slots__ = ("upstream", "upstream_paused")
    upstream: UpstreamConnection | H2UpstreamStream | None
    # Upstream reading is paused because the client reads slower than the upstream answers.
    upstream_paused: bool

    def pair(self, upstream: UpstreamConnection, data: bytes) -> None:
        """`upstream` serves this client from now on; `data` (a request's first bytes) goes to it."""
        self.upstream = upstream
        upstream.transport.write(data)

    def link(self, upstream: H2UpstreamStream) -> None:
        """`upstream` (a stream, sent its head by the exchange) serves this client from now on."""
        self.upstream = upstream

    def unpair(self, upstream: UpstreamConnection | H2UpstreamStream) -> None:
        """`upstream` stops serving this client (pooled or closed): reading it again is its next user's business."""
        if self.upstream is not upstream:
            return
        self.upstream = None
        if self.upstream_paused:
            self.upstream_paused = False
            if not upstream.closed and not upstream.transport.is_closing():
                upstream.transport.resume_reading()

    def to_upstream(self, data: bytes) -> None:
        upstream = self.upstream
        if upstream is not None:
            upstream.transport.write(data)


class Flow(Pairing):
    __slots__ = ("chunked", "client", "reads")

    def __init__(self, client: ClientConnection) -> None:
        self.client = client
        self.upstream: UpstreamConnection | H2UpstreamStream | None = None
        # The HTTP/2 response being written is chunked for the client (it came without a content-length).
        self.chunked = False
        # Upstream reading is paused because the client reads slower than the upstream answers.
        self.upstream_paused = False
        # A tunnel's reads, both directions: the client's sweeper closes one that stops moving.
        self.reads = 0

    # --- bytes ---

    def to_client(self, data: bytes) -> None:
        self.client.transport.write(data)

    # --- an HTTP/2 upstream's response, for this HTTP/1.1 client ---

    def response(self, exchange: Exchange, status: int, fields: Fields) -> None:
        server = self.client.server
        head, self.chunked, close = h1_response_head(
            status,
            fields,
            exchange.is_head,
            exchange.keep_alive,
            exchange.body_done,
            server.draining,
            exchange.http10,
            exchange.waited if exchange.cold else None,
            server.via,
        )
        exchange.response_begins(close, status)
        self.client.transport.write(head)

    def data(self, data: bytes) -> None:
        self.client.transport.write(chunk(data) if self.chunked else data)

    def end(self, upstream: H2UpstreamStream, trailers: Fields | None) -> None:
        """The response ended (its trailer fields go in the last chunk, when it is chunked)."""
        self.finish(upstream, chunk_end(trailers) if self.chunked else b"")  # type: ignore[arg-type]
        self.chunked = False

    def finish(self, upstream: UpstreamConnection, data: bytes) -> None:
        """The response's last bytes (maybe none): written, and `upstream` no longer serves this client."""
        if data:
            self.client.transport.write(data)
        if self.upstream is upstream and not self.upstream_paused:
            self.upstream = None  # unpair's common case, inlined: docs/architecture.md#hot-skipped-calls
        else:
            self.unpair(upstream)

    def relay_to_client(self, data: bytes) -> None:
        self.reads += 1
        self.client.transport.write(data)

    def relay_to_upstream(self, data: bytes) -> None:
        self.reads += 1
        self.to_upstream(data)

    # --- back-pressure ---

    def client_slow(self) -> None:
        upstream = self.upstream
        if upstream is not None and not upstream.closed:
            upstream.transport.pause_reading()
            self.upstream_paused = True

    def client_ready(self) -> None:
        upstream = self.upstream
        if self.upstream_paused and upstream is not None:
            self.upstream_paused = False
            if not upstream.closed:
                upstream.transport.resume_reading()

    def upstream_slow(self) -> None:
        self.client.pause_reading_for_upstream()

    def upstream_ready(self) -> None:
        self.client.resume_reading_for_upstream()
