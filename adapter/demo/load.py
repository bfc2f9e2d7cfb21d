"""The demo's HTTP clients: requests to the proxy, each on its own connection, each result recorded.

A request counts as lost unless it is answered 200: a proxy error (503, 504, 502), a reset or a
timeout is a request the user did not get served.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from adapter.demo.stack import HOST
from adapter.demo.timeline import RequestResult, Timeline

_TIMEOUT = 90.0  # above the route's hold timeout: the proxy answers first


async def _get(port: int, path: str) -> tuple[bool, str]:
    reader, writer = await asyncio.open_connection(HOST, port)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: web.demo\r\nConnection: close\r\n\r\n".encode())
        response = await reader.read()  # the server closes after the response (Connection: close)
    finally:
        writer.close()
    status_line = response.split(b"\r\n", 1)[0].decode("latin-1")
    parts = status_line.split(" ", 2)
    if len(parts) >= 2 and parts[1] == "200":
        return True, ""
    return False, status_line or "connection closed without a response"


async def request(port: int, timeline: Timeline, is_cold: Callable[[], bool], path: str = "/") -> RequestResult:
    cold = is_cold()
    sent = time.monotonic()
    try:
        async with asyncio.timeout(_TIMEOUT):
            ok, error = await _get(port, path)
    except (OSError, TimeoutError) as err:
        ok, error = False, f"{type(err).__name__}: {err}"
    result = RequestResult(timeline.since_start(sent), time.monotonic() - sent, ok, cold, error)
    timeline.requests.append(result)
    return result


async def burst(port: int, timeline: Timeline, is_cold: Callable[[], bool], seconds: float, clients: int) -> None:
    """`clients` concurrent users, each sending one request after another for `seconds`."""
    deadline = time.monotonic() + seconds

    async def user(number: int) -> None:
        while time.monotonic() < deadline:
            await request(port, timeline, is_cold, f"/burst/{number}")

    await asyncio.gather(*(user(n) for n in range(clients)))
