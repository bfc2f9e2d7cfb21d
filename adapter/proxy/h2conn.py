"""What both HTTP/2 sides share: how the h2 library is configured (a GOAWAY leaves its streams to finish), and how
its frames reach the socket.

Frames are written once per turn of the event loop (`Outbox.flush_soon`), not once per call that makes some: a
response's HEADERS, DATA and END_STREAM, and every stream answered in the same turn, go out in one write (a write
is a system call, and was most of the cost of a stream before this).
"""

from __future__ import annotations

import asyncio

import h2.config
import h2.connection
import h2.events

_GOAWAY_INPUTS = (h2.connection.ConnectionInputs.SEND_GOAWAY, h2.connection.ConnectionInputs.RECV_GOAWAY)


class _GoawayKeepsOpen(h2.connection.H2ConnectionStateMachine):
    """h2's connection state machine but for GOAWAY, sent or received: h2 closes the connection on one at once
    (python-hyper/h2#1181) and refuses every frame after it, even later frames of the same read, where RFC 9113 6.8
    lets the streams begun before it finish. Each side ends the connection itself once its streams are done
    (h2client: and refuses the streams a client opens after the proxy's GOAWAY; h2upstream: and sends elsewhere the
    streams above the peer's last-stream-id)."""

    def process_input(self, input_: h2.connection.ConnectionInputs) -> list[h2.events.Event]:
        if input_ in _GOAWAY_INPUTS:
            return []
        return super().process_input(input_)


def h2_connection(*, client_side: bool) -> h2.connection.H2Connection:
    """An h2 connection with bytes header fields; what arrives is validated (a peer's fields reach the other
    protocol, where a CR or LF would split a head), what the proxy sends is not again: it is built from validated
    fields and its own."""
    config = h2.config.H2Configuration(
        client_side=client_side,
        header_encoding=None,
        validate_inbound_headers=True,
        validate_outbound_headers=False,
        normalize_outbound_headers=False,
    )
    connection = h2.connection.H2Connection(config)
    connection.state_machine = _GoawayKeepsOpen()
    return connection


def send_within_window(connection: h2.connection.H2Connection, stream_id: int, unsent: list[bytes]) -> int:
    """Send `unsent`'s pieces in order as DATA, as far as the stream's flow-control window and the peer's frame size
    allow; what went leaves `unsent` (a piece cut at the window keeps its rest first). Returns the bytes sent."""
    sent = 0
    while unsent:
        room = min(connection.local_flow_control_window(stream_id), connection.max_outbound_frame_size)
        if room <= 0:
            break
        piece = unsent[0]
        if len(piece) > room:
            connection.send_data(stream_id, piece[:room])
            unsent[0] = piece[room:]
            sent += room
            continue
        connection.send_data(stream_id, piece)
        unsent.pop(0)
        sent += len(piece)
    return sent


def end_stream(
    connection: h2.connection.H2Connection, stream_id: int, trailers: list[tuple[bytes, bytes]] | None
) -> None:
    """END_STREAM, on the trailer fields when there are any."""
    if trailers:
        connection.send_headers(stream_id, trailers, end_stream=True)
    else:
        connection.end_stream(stream_id)


class Outbox:
    """The frames an h2 connection has made, written to its transport at the end of the current loop turn."""

    __slots__ = ("_scheduled", "h2", "transport")

    def __init__(self, connection: h2.connection.H2Connection) -> None:
        self.h2 = connection
        self.transport: asyncio.Transport | None = None
        self._scheduled = False

    def flush(self) -> None:
        """Write now (the end of a read: what it made goes in one write)."""
        self._scheduled = False
        data = self.h2.data_to_send()
        transport = self.transport
        if data and transport is not None and not transport.is_closing():
            transport.write(data)

    def flush_soon(self) -> None:
        """Write at the end of this loop turn, with whatever else the turn makes."""
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._flush_scheduled)

    def _flush_scheduled(self) -> None:
        if self._scheduled:
            self.flush()
