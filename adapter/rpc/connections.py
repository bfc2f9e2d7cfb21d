"""How many connections a gRPC listener holds, and a warning when its cap is reached.

gRPC core enforces the cap itself (`grpc.max_allowed_incoming_connections`: a connection beyond it
is closed at accept) but tells nobody. So the kernel's socket table is read instead: every socket
of this network namespace whose local port is the listener's, in state 01 (established) or 08
(closed by the peer, not yet by us), and that has a descriptor (inode not 0) is one connection. A
connection still in the accept queue (no descriptor yet, inode 0) is not: gRPC has not taken it,
and counting those read 51 with a cap of 20 while a peer churned connections. A pod has its own
network namespace, so these are the listener's own connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from pathlib import Path

from adapter.telemetry import rpc as telemetry
from adapter.telemetry.throttle import LogThrottle, held_back

log = logging.getLogger(__name__)
_throttle = LogThrottle(30.0)

_TABLES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))
# Reading the table costs the kernel a line per socket of the pod: a few times a minute is enough for a gauge.
_SAMPLE_SECONDS = 5.0


def count_connections(port: int) -> int:
    """Connections whose local end is `port` (0 where the kernel does not publish its tables).

    One regular expression over each table (a line is `sl local rem st ...`, addresses `HEX:PORT`): the
    table holds every socket of the pod, thousands on a busy proxy, and this runs off the event loop.
    """
    # sl local rem st tx_queue:rx_queue tr:when retransmits uid timeout inode
    line = re.compile(
        rb":%04X [0-9A-F]+:[0-9A-F]{4} (?:01|08) [0-9A-F]+:[0-9A-F]+ [0-9A-F]+:[0-9A-F]+ [0-9A-F]+ +\d+ +\d+ +[1-9]"
        % port
    )
    total = 0
    for table in _TABLES:
        try:
            total += len(line.findall(table.read_bytes()))
        except OSError:
            continue
    return total


class ConnectionWatch:
    """The `zeroscale_grpc_connections` gauge of one listener; a warning each time it reaches its cap."""

    def __init__(self, server: str, port: int, limit: int) -> None:
        self._server = server
        self._port = port
        self._limit = limit
        self._full = False
        telemetry.GRPC_CONNECTION_LIMIT.labels(server).set(limit)
        self._task = asyncio.create_task(self._sample(), name=f"grpc.{server} connections")

    async def _sample(self) -> None:
        gauge = telemetry.GRPC_CONNECTIONS.labels(self._server)
        while True:
            open_now = await asyncio.to_thread(count_connections, self._port)
            gauge.set(open_now)
            # gRPC counts the connection it is accepting against the cap too: at the cap it was seen holding
            # `limit - 1` while closing every new one, so one short of it is already "full".
            full = open_now >= max(1, self._limit - 1)
            if full and not self._full:
                telemetry.GRPC_CONNECTIONS_FULL.labels(self._server).inc()
                held = _throttle.allow(self._server)
                if held is not None:
                    log.warning(
                        "grpc.%s: %d connections open, the cap: new ones are closed at accept "
                        "(raise grpc.%s.max_connections, or find who holds them)%s",
                        self._server,
                        open_now,
                        self._server,
                        held_back(held),
                    )
            self._full = full
            await asyncio.sleep(_SAMPLE_SECONDS)

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
