"""The proxy's layering: one request's walk enters each module no more often than its budget, per direction.

The calls into modules of adapter/proxy/ are recorded (sys.setprofile) while one request goes through the proxy;
an entry is a call from another module (or from the event loop). A walk is split into its phases, each the extent
of one call (from that call to its return): forward, the request from the route to the upstream's transport; back,
the upstream's read of the response to the client told the exchange finished. On the cold path the forward walk is
two phases: the hold (the route finds no endpoint), and the release (the route's pump, once an endpoint is ready).

Each phase has a budget: module -> the entries it may take, and a module not in it none. A module entered more often
than its budget means two objects reach into each other's state (docs/architecture.md), or a new call crept onto a
path every request takes; a budget is raised only with a comment saying which call needs it.
"""

from __future__ import annotations

import asyncio
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any, NamedTuple

import h2.config
import h2.connection
import h2.events

import adapter.proxy.server
from adapter.proxy.app import Proxy
from tests.fixtures.netutil import refused_port
from tests.fixtures.proxy import get, read_response, request, route, running_proxy, until
from tests.fixtures.upstream_app import Upstream

_PROXY = str(Path(adapter.proxy.server.__file__).parent)

Budget = dict[str, int]

# A request to a ready endpoint, on a pooled connection.
WARM_FORWARD: Budget = {
    "route.py": 1,  # submit
    "counts.py": 1,  # add: in flight
    "exchange.py": 1,  # to_endpoint (attach follows within it)
    "upstream.py": 1,  # dispatch: the pooled connection (its response deadline starts with the body's end, later)
    "flow.py": 1,  # pair: the request's bytes to the upstream's transport
}
_BACK: Budget = {
    "upstream.py": 1,  # data_received
    "headers.py": 1,  # forwarded_response_head
    "http1.py": 1,  # status_line, the first time a status is forwarded (then cached)
    "exchange.py": 2,  # response_begins (the head came: facts the exchange owns), response_done
    "route.py": 1,  # leave
    "counts.py": 1,  # add: no longer in flight
}
WARM_BACK: Budget = {
    **_BACK,
    "flow.py": 1,  # finish: the response's bytes to the client
    "client.py": 1,  # exchange_finished
}
# The same, for a stream of an HTTP/2 client (h2client.H2Stream is the exchange's client end and its flow).
H2_FORWARD: Budget = {
    "route.py": 1,  # submit
    "counts.py": 1,  # add
    "exchange.py": 1,  # to_endpoint
    # dispatch; expect_response (a stream whose head ends it is whole once sent)
    "upstream.py": 2,
    "h2wire.py": 1,  # h1_request_head: the stream's fields as the HTTP/1.1 upstream's head
    "flow.py": 1,  # Pairing.pair (H2Stream's): the head to the upstream's transport
}
H2_BACK: Budget = {
    **_BACK,
    "h2client.py": 2,  # H2Stream.finish (the response re-read as HTTP/2), H2Stream.exchange_finished
    "h2wire.py": 1,  # h2_response_head
    # Outbox.flush_soon after the head and after the body and its end (one write for all, later); h2 asking the
    # connection's state machine (h2conn._GoawayKeepsOpen) as it sends the head and the end; send_within_window (the
    # body) and end_stream
    "h2conn.py": 6,
    "flow.py": 1,  # Pairing.unpair (H2Stream's): the response is over
}
# The cold path: held while no endpoint is ready (the hold), sent by the route's pump once one is (the release).
HOLD: Budget = {
    "route.py": 1,  # submit
    "exchange.py": 1,  # to_queue
    "counts.py": 1,  # add: held
}
RELEASE: Budget = {
    "counts.py": 1,  # add: in flight, no longer held
    "exchange.py": 1,  # to_endpoint
    "upstream.py": 2,  # dispatch (the prober's connection, pooled); expect_response (a GET is whole once sent)
    "flow.py": 1,  # pair
}
COLD_BACK: Budget = {**WARM_BACK, "route.py": 2}  # first_byte: a cold start's last phase ends; leave
# Entered only the first time in a process (a cache fills): a phase may not enter them at all.
_ONCE_PER_PROCESS = {"http1.py"}


def _module(frame: FrameType | None) -> str | None:
    if frame is None:
        return None
    path = frame.f_code.co_filename
    return Path(path).name if path.startswith(_PROXY) else None


class _Event(NamedTuple):
    kind: str  # "call" or "return"
    module: str
    function: str
    entry: bool  # a call from another module (or from the event loop)
    frame: int


class _Walk:
    """Calls and returns of proxy functions, in order."""

    def __init__(self) -> None:
        self.events: list[_Event] = []

    def __call__(self, frame: FrameType, event: str, _arg: Any) -> None:
        if event not in ("call", "return"):
            return
        module = _module(frame)
        if module is not None:
            entry = event == "call" and _module(frame.f_back) != module
            self.events.append(_Event(event, module, frame.f_code.co_name, entry, id(frame)))

    def phase(self, module: str, function: str) -> Counter[str]:
        """The entries per module in the extent of the first call of `module`'s `function` (from it to its return)."""
        events = self.events
        first = next(i for i, e in enumerate(events) if (e.kind, e.module, e.function) == ("call", module, function))
        last = next(
            i
            for i in range(first, len(events))
            if events[i].kind == "return" and events[i].frame == events[first].frame
        )
        return Counter(e.module for e in events[first : last + 1] if e.entry)


@contextmanager
def walking() -> Iterator[_Walk]:
    walk = _Walk()
    sys.setprofile(walk)
    try:
        yield walk
    finally:
        sys.setprofile(None)


def assert_within(entries: Counter[str], budget: Budget) -> None:
    """No module entered more often than its budget allows; and every module budgeted entered (a budget is tight)."""
    over = {module: seen for module, seen in entries.items() if seen > budget.get(module, 0)}
    assert not over, f"entries over budget: {over} (all: {dict(entries)}, budget: {budget})"
    unused = set(budget) - set(entries) - _ONCE_PER_PROCESS
    assert not unused, f"budgeted, never entered: {unused} (all: {dict(entries)}): lower the budget"


async def test_a_warm_request_stays_within_its_budgets(proxy: Proxy) -> None:
    port = proxy.port
    assert (await request(port, get())).status == 200  # a pooled upstream connection for the walk
    with walking() as walk:
        response = await request(port, get())
    assert response.status == 200
    assert_within(walk.phase("route.py", "submit"), WARM_FORWARD)
    assert_within(walk.phase("upstream.py", "data_received"), WARM_BACK)


async def test_a_held_request_stays_within_its_budgets_from_hold_to_release() -> None:
    port = refused_port()
    async with running_proxy([route("walked", f"127.0.0.1:{port}")]) as server:
        walked = server.routes["default/walked"]
        counts = walked.counts
        # A first request finds the endpoint refusing (and is held): from then on the endpoint is known not ready.
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(get())
        await until(lambda: counts.held == 1 and not walked.has_usable())
        writer.close()
        await until(lambda: counts.held == 0)
        with walking() as walk:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(get())
            await until(lambda: counts.held == 1)
            upstream = await Upstream(port).start()
            try:
                response = await read_response(reader)
            finally:
                writer.close()
                await upstream.stop()
    assert response.status == 200
    assert response.headers["x-zeroscale-cold-start"] == "true"
    assert_within(walk.phase("route.py", "submit"), HOLD)
    assert_within(walk.phase("route.py", "pump"), RELEASE)
    assert_within(walk.phase("upstream.py", "data_received"), COLD_BACK)


async def _h2_get(port: int) -> int:
    """One GET on a new HTTP/2 connection (prior knowledge, h2's client side): its status once its stream ended."""
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
    client.initiate_connection()
    client.send_headers(
        1, [(b":method", b"GET"), (b":scheme", b"http"), (b":authority", b"app.example"), (b":path", b"/echo")], True
    )
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(client.data_to_send())
        status = 0
        async with asyncio.timeout(10):
            while True:
                data = await reader.read(65536)
                assert data, "closed before the stream ended"
                for event in client.receive_data(data):
                    if isinstance(event, h2.events.ResponseReceived):
                        status = int(dict(event.headers or [])[b":status"])
                    elif isinstance(event, h2.events.StreamEnded):
                        return status
                writer.write(client.data_to_send())
    finally:
        writer.close()


async def test_an_http2_stream_stays_within_its_budgets(proxy: Proxy) -> None:
    port = proxy.port
    assert await _h2_get(port) == 200  # a pooled upstream connection for the walk
    with walking() as walk:
        status = await _h2_get(port)
    assert status == 200
    assert_within(walk.phase("route.py", "submit"), H2_FORWARD)
    assert_within(walk.phase("upstream.py", "data_received"), H2_BACK)
