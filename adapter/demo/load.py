"""The demo's HTTP clients: requests to the proxy, each on its own connection, each result recorded.

A request counts as lost unless it is answered 200: a proxy error (503, 504, 502), a reset or a
timeout is a request the user did not get served. A browser visit is a person's: the waking page at once,
the app after the page reloads itself.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from adapter.demo.stack import HOST
from adapter.demo.timeline import BrowserVisit, RequestResult, Timeline

_TIMEOUT = 90.0  # above the route's hold timeout: the proxy answers first
# What a browser sends when a person opens a page (a navigation): the proxy's waking page is for these only.
_NAVIGATION = (
    "Accept: text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,*/*;q=0.8\r\n"
    "Sec-Fetch-Mode: navigate\r\nSec-Fetch-Dest: document\r\n"
)
_WAKING_PAGE_MARK = b'http-equiv="refresh"'


async def _get(port: int, path: str, extra_headers: str = "") -> tuple[str, dict[str, str], bytes]:
    """One GET on a connection of its own: the status line, the headers (names lowered) and the body."""
    reader, writer = await asyncio.open_connection(HOST, port)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: web.demo\r\n{extra_headers}Connection: close\r\n\r\n".encode())
        response = await reader.read()  # the server closes after the response (Connection: close)
    finally:
        writer.close()
    head, _, body = response.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {name.strip().lower(): value.strip() for name, _, value in (line.partition(":") for line in lines)}
    return status_line, headers, body


def _status(status_line: str) -> str:
    parts = status_line.split(" ", 2)
    return parts[1] if len(parts) >= 2 else ""


async def request(port: int, timeline: Timeline, is_cold: Callable[[], bool], path: str = "/") -> RequestResult:
    cold = is_cold()
    sent = time.monotonic()
    try:
        async with asyncio.timeout(_TIMEOUT):
            status_line, _, _ = await _get(port, path)
        ok = _status(status_line) == "200"
        error = "" if ok else status_line or "connection closed without a response"
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


async def browse(port: int, timeline: Timeline) -> BrowserVisit:
    """A person opens the app: the waking page is expected at once, then the browser reloads it every
    Retry-After seconds (what the page's meta refresh does) until the app's own page comes."""
    sent = time.monotonic()
    page_seconds: float | None = None
    reloads = 0
    error = ""
    try:
        async with asyncio.timeout(_TIMEOUT):
            while True:
                status_line, headers, body = await _get(port, "/", _NAVIGATION)
                if _status(status_line) == "200" and _WAKING_PAGE_MARK not in body:
                    visit = BrowserVisit(timeline.since_start(sent), page_seconds, time.monotonic() - sent, reloads)
                    break
                if _WAKING_PAGE_MARK not in body:
                    error = status_line or "connection closed without a response"
                    visit = BrowserVisit(timeline.since_start(sent), page_seconds, None, reloads, error)
                    break
                if page_seconds is None:
                    page_seconds = time.monotonic() - sent
                reloads += 1
                await asyncio.sleep(float(headers.get("retry-after", "1")))
    except (OSError, TimeoutError, ValueError) as err:
        visit = BrowserVisit(timeline.since_start(sent), page_seconds, None, reloads, f"{type(err).__name__}: {err}")
    timeline.visits.append(visit)
    return visit
