"""The proxy's layering: one request's walk enters each module at most once per direction.

The calls between modules of adapter/proxy/ are recorded (sys.setprofile) while one warm request is
forwarded: from Route.submit until the request is written upstream, and from the upstream's first
response read until the client connection is told the exchange finished. A module the walk enters
twice in one direction means two objects reach into each other's state (see docs/architecture.md).
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

import adapter.proxy.server
from adapter.proxy.app import Proxy
from tests.fixtures.proxy import get, request

_PROXY = str(Path(adapter.proxy.server.__file__).parent)


def _module(frame: FrameType | None) -> str | None:
    if frame is None:
        return None
    path = frame.f_code.co_filename
    return Path(path).name if path.startswith(_PROXY) else None


class _Walk:
    """Entries into proxy modules (a call from another module), split where the direction turns."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def __call__(self, frame: FrameType, event: str, _arg: Any) -> None:
        if event != "call":
            return
        callee = _module(frame)
        if callee is not None and _module(frame.f_back) != callee:
            self.calls.append((callee, frame.f_code.co_name))

    def between(self, start: tuple[str, str], end: tuple[str, str]) -> list[str]:
        first = self.calls.index(start)
        last = self.calls.index(end, first)
        return [module for module, _ in self.calls[first : last + 1]]


async def test_one_request_enters_each_module_once_per_direction(proxy: Proxy) -> None:
    port = proxy.port
    assert (await request(port, get())).status == 200  # a pooled upstream connection for the walk
    walk = _Walk()
    sys.setprofile(walk)
    try:
        response = await request(port, get())
    finally:
        sys.setprofile(None)
    assert response.status == 200
    forward = walk.between(("route.py", "submit"), ("flow.py", "pair"))
    back = walk.between(("upstream.py", "data_received"), ("client.py", "exchange_finished"))
    assert not [module for module, seen in Counter(forward).items() if seen > 1], forward
    # Back, the exchange is told twice, each time a fact it owns: its response began, then it is done.
    allowed = {"exchange.py": 2}
    assert not [module for module, seen in Counter(back).items() if seen > allowed.get(module, 1)], back
