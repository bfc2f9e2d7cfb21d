"""The proxy's protocols without sockets: an event loop whose clock the test moves, and transports the test reads.

`VirtualClockLoop` is asyncio's own loop (BaseEventLoop: the ready queue, the timer heap, tasks) with the two things
that come from outside replaced, as CPython's test suite does with its TestLoop: the clock (`time()` reads a number
only `advance` moves) and the I/O poller (there is no I/O; a poll that would wait in real time raises, since
nothing but the test's `advance` can make a timer due). Everything the proxy schedules (an exchange's hold timer,
`asyncio.timeout` around a dial, the route's prober) therefore fires at exactly its virtual time, in order, so a
test asserts "not at 249 ms, at 250 ms" without a wall clock. Dialling an endpoint (`create_connection`) hands the
protocol a `FakeTransport`, at once or after the virtual time `slow` says, or refuses as scripted by `refuse`.

`FakeTransport` is what a socket's transport does for a protocol, recorded: writes, pauses, write_eof, close and
abort (which, as asyncio's transports do, end in the protocol's `connection_lost` on the next loop iteration). The
test plays the peer: `feed` what it sends, `take` what it was sent, `hang_up`.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable
from typing import Any

_SETTLE_LIMIT = 10_000
# A timer this close past the time the clock is moved to is taken as due then (the sums of float seconds drift).
_EPSILON = 1e-9


class FakeTransport(asyncio.Transport):
    __slots__ = ("aborted", "closed", "eof", "late", "lost", "pauses", "peer", "protocol", "reading", "writes")

    def __init__(self, protocol: asyncio.BaseProtocol, peer: tuple[str, int]) -> None:
        super().__init__()
        self.protocol = protocol
        self.peer = peer
        self.writes: list[bytes] = []
        # Writes after write_eof, close or abort: a real transport drops or refuses them, and the proxy never
        # should make them.
        self.late: list[bytes] = []
        self.reading = True
        self.pauses = 0
        self.eof = False
        self.closed = False
        self.aborted = False
        self.lost = False

    # --- what the protocol calls ---

    def write(self, data: bytes | bytearray | memoryview) -> None:
        (self.late if self.eof or self.is_closing() else self.writes).append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed or self.aborted

    def close(self) -> None:
        if not self.is_closing():
            self.closed = True
            asyncio.get_running_loop().call_soon(self.hang_up)

    def abort(self) -> None:
        if not self.is_closing():
            self.aborted = True
            asyncio.get_running_loop().call_soon(self.hang_up)

    def pause_reading(self) -> None:
        self.reading = False
        self.pauses += 1

    def resume_reading(self) -> None:
        self.reading = True

    def is_reading(self) -> bool:
        return self.reading

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.peer if name == "peername" else default

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self.protocol = protocol

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self.protocol

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.eof = True

    def get_write_buffer_size(self) -> int:
        return 0

    # --- what the test, as the peer, does ---

    def feed(self, data: bytes) -> None:
        assert not self.lost, "the connection is gone"
        self.protocol.data_received(data)  # type: ignore[attr-defined]

    def take(self) -> bytes:
        """What was written since the last take."""
        data, self.writes = b"".join(self.writes), []
        return data

    def hang_up(self) -> None:
        """The connection ends (the peer closed it, or our close or abort took effect): connection_lost, once."""
        if not self.lost:
            self.lost = True
            self.protocol.connection_lost(None)


class _NoIO:
    """The loop's selector: no I/O is ever ready, and a wait in real time is a test that forgot to move the clock."""

    def select(self, timeout: float | None) -> list[Any]:
        if timeout != 0:
            raise RuntimeError(
                "the loop would wait in real time: what the test awaits happens only when the clock is moved "
                "(VirtualClockLoop.advance)"
            )
        return []


class VirtualClockLoop(asyncio.BaseEventLoop):
    # BaseEventLoop's own queues, read to tell when nothing is left to run at the current time.
    _ready: collections.deque[asyncio.Handle]
    _scheduled: list[asyncio.TimerHandle]

    def __init__(self) -> None:
        super().__init__()
        self._selector = _NoIO()
        self._now = 1000.0
        self.start = self._now
        self._refusing: dict[tuple[str, int], int] = {}
        self._slow: dict[tuple[str, int], float] = {}
        # Every connection dialled, in order: (address, transport).
        self.dialled: list[tuple[tuple[str, int], FakeTransport]] = []
        # Called with each connection dialled, as the peer would accept it (an HTTP/2 server sends its SETTINGS).
        self.on_dial: Callable[[FakeTransport], object] | None = None

    def time(self) -> float:
        return self._now

    @property
    def ms(self) -> float:
        """Milliseconds since the loop was made."""
        return round((self._now - self.start) * 1000, 6)

    def _process_events(self, event_list: list[Any]) -> None:
        pass  # no I/O

    def _write_to_self(self) -> None:
        pass  # nothing waits in a poll to be woken

    # --- the clock ---

    async def settle(self) -> None:
        """Run everything due at the current time (callbacks, task steps, timers), and what that makes due."""
        for _ in range(_SETTLE_LIMIT):
            if not self._ready and not self._due(self._now):
                return
            await asyncio.sleep(0)
        raise RuntimeError(f"still busy after {_SETTLE_LIMIT} iterations at {self.ms} ms")

    async def advance(self, ms: float) -> None:
        """Move the clock `ms` milliseconds on, stopping at each timer due on the way to run it at its own time."""
        target = self._now + ms / 1000
        await self.settle()
        while (when := self._next_timer(target + _EPSILON)) is not None:
            self._now = max(self._now, when)
            await self.settle()
        self._now = max(self._now, target)
        await self.settle()

    def _due(self, now: float) -> bool:
        return self._next_timer(now) is not None

    def _next_timer(self, until: float) -> float | None:
        whens = [timer.when() for timer in self._scheduled if not timer.cancelled() and timer.when() <= until]
        return min(whens) if whens else None

    # --- the network ---

    def refuse(self, address: tuple[str, int], times: int = 1_000_000) -> None:
        """The next `times` dials to `address` are refused."""
        self._refusing[address] = times

    def slow(self, address: tuple[str, int], ms: float) -> None:
        """Dials to `address` connect `ms` milliseconds after they start."""
        self._slow[address] = ms / 1000

    async def create_connection(  # type: ignore[override]  # the (factory, host, port) form the proxy uses
        self, protocol_factory: Callable[[], asyncio.BaseProtocol], host: str, port: int, **_: Any
    ) -> tuple[FakeTransport, asyncio.BaseProtocol]:
        address = (host, port)
        if address in self._slow:
            await asyncio.sleep(self._slow[address])
        if self._refusing.get(address, 0) > 0:
            self._refusing[address] -= 1
            raise ConnectionRefusedError(111, f"connect to {host}:{port} refused")
        protocol = protocol_factory()
        transport = FakeTransport(protocol, address)
        protocol.connection_made(transport)
        self.dialled.append((address, transport))
        if self.on_dial is not None:
            self.on_dial(transport)
        return transport, protocol
