"""Differential fuzzing: what the upstream receives, read by h11 (a parser independent of the proxy's
llhttp), is the same requests, in the same number, with the same bodies and Host, as h11 reads from the
bytes the client sent; or a prefix of them, when the proxy refused one with an answer of its own.

This is the property request smuggling breaks: a body forwarded as a request, a request hidden in a
body, a request forwarded without its Host. The client's bytes mix pipelined requests, Content-Length
and chunked bodies (with chunk extensions and splits), Connection options (framing headers included),
absolute-form targets, and hostile headers (duplicated framing, obs-fold, bare LF, odd whitespace);
they are written in random pieces. Bounded: a fixed number of examples, each a few milliseconds.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

import h11
import httptools
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adapter.proxy.app import Proxy
from tests.fixtures.proxy import route, running_proxy
from tests.security.h11_upstream import H11Upstream

END = b"GET /end HTTP/1.1\r\nHost: app.example\r\nConnection: close\r\n\r\n"

_HOSTILE = [
    b"X-A: plain",
    b"X-A:  padded \t",
    b"Content-Length: 3",
    b"Content-Length: 0",
    b"Transfer-Encoding: chunked",
    b"Transfer-Encoding: gzip",
    b"Transfer-Encoding: identity",
    b"Host: other.example",
    b"X-B: folded\r\n continued",
    b"X-C: bare\nX-D: lf",
    b"X-E: cr\rinside",
    b"Expect: 100-continue",
    b"X-Forwarded-For: 10.9.9.9",
    b"Keep-Alive: timeout=5",
    b"TE: trailers",
    b"Proxy-Connection: keep-alive",
]
_OPTIONS = [
    b"close",
    b"x-a",
    b"te",
    b"content-length",
    b"transfer-encoding",
    b"host",
    b"x-forwarded-for",
    b"keep-alive",
]


@st.composite
def _request(draw: st.DrawFn) -> bytes:
    method = draw(st.sampled_from([b"GET", b"POST", b"PUT", b"DELETE", b"OPTIONS"]))
    http10 = draw(st.integers(0, 9)) == 0
    index = draw(st.integers(0, 999))
    target = b"/echo?i=%d" % index
    lines: list[bytes] = []
    if draw(st.booleans()) and draw(st.booleans()):
        target = b"http://%b%b" % (draw(st.sampled_from([b"web.test", b"app.example:8080", b"WEB.test"])), target)
    if not http10 or draw(st.booleans()):
        lines.append(b"Host: " + draw(st.sampled_from([b"app.example", b"app.example ", b" app.example", b"a.b:81"])))
    body = draw(st.binary(max_size=40))
    framing = draw(st.sampled_from(["length", "chunked", "none"])) if body else "none"
    if framing == "length":
        lines.append(b"Content-Length: %d" % len(body))
        payload = body
    elif framing == "chunked":
        lines.append(b"Transfer-Encoding: " + draw(st.sampled_from([b"chunked", b"Chunked", b" chunked "])))
        cuts = sorted(draw(st.lists(st.integers(1, len(body)), max_size=3, unique=True)))
        pieces = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True) if body[a:b]]
        extension = draw(st.sampled_from([b"", b";ext=1", b';a="b"']))
        payload = b"".join(b"%x%b\r\n%b\r\n" % (len(p), extension, p) for p in pieces) + b"0\r\n\r\n"
    else:
        payload = b""
    options = draw(st.lists(st.sampled_from(_OPTIONS), max_size=3))
    if http10:
        options = [o for o in options if o != b"keep-alive"]  # h11 never keeps an HTTP/1.0 connection
    if options:
        lines.append(b"Connection: " + b", ".join(options))
    lines += draw(st.lists(st.sampled_from(_HOSTILE), max_size=2))
    lines = draw(st.permutations(lines))
    version = b"HTTP/1.0" if http10 else b"HTTP/1.1"
    return b"%b %b %b\r\n%b\r\n%b" % (method, target, version, b"".join(line + b"\r\n" for line in lines), payload)


@dataclass(frozen=True)
class _Seen:
    method: bytes
    target: bytes
    host: bytes
    body: bytes


def _origin(target: bytes, host: bytes | None) -> tuple[bytes, bytes | None]:
    """An absolute-form target as the proxy forwards it: (origin-form target, authority as the Host)."""
    if not target.lower().startswith(b"http://"):
        return target, host
    rest = target[len(b"http://") :]
    end = min((at for at in (rest.find(b"/"), rest.find(b"?")) if at != -1), default=len(rest))
    path = rest[end:]
    return (path if path.startswith(b"/") else b"/" + path), rest[:end]


def _as_h11_reads(stream: bytes, default_host: bytes) -> list[_Seen]:
    """The requests h11 reads from the client's bytes, up to the first it cannot read or a close."""
    connection = h11.Connection(h11.SERVER)
    connection.receive_data(stream)
    connection.receive_data(b"")
    seen: list[_Seen] = []
    current: h11.Request | None = None
    body = b""
    with contextlib.suppress(h11.RemoteProtocolError):
        while True:
            event = connection.next_event()
            if isinstance(event, h11.Request):
                current, body = event, b""
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage) and current is not None:
                hosts = [value for name, value in current.headers if name == b"host"]
                target, host = _origin(current.target, hosts[0] if hosts else None)
                seen.append(_Seen(current.method, target, host if host is not None else default_host, body))
                connection.send(h11.Response(status_code=200, headers=[("Content-Length", "0")]))
                connection.send(h11.EndOfMessage())
                if connection.our_state is not h11.DONE or connection.their_state is not h11.DONE:
                    break
                connection.start_next_cycle()
            else:
                break
    return seen


def _final_responses(data: bytes) -> list[bool]:
    """For each final (non-1xx) response on the client connection: whether the proxy wrote it itself."""

    class Reader:
        def __init__(self) -> None:
            self.own = False
            self.found: list[bool] = []

        def on_message_begin(self) -> None:
            self.own = False

        def on_header(self, name: bytes, _value: bytes) -> None:
            self.own = self.own or name.lower() == b"x-zeroscale-proxy"

        def on_message_complete(self) -> None:
            if parser.get_status_code() >= 200:
                self.found.append(self.own)

    reader = Reader()
    parser = httptools.HttpResponseParser(reader)
    parser.feed_data(data)
    return reader.found


@pytest.fixture
async def differential() -> AsyncIterator[tuple[Proxy, H11Upstream]]:
    upstream = await H11Upstream().start()
    limits = {"body_timeout": 1}
    async with running_proxy(
        [route("app", upstream.address, limits=limits)], header_timeout=1, idle_timeout=1
    ) as server:
        yield server, upstream
    await upstream.stop()


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    requests=st.lists(_request(), min_size=1, max_size=6),
    cuts=st.lists(st.integers(1, 400), max_size=4),
)
async def test_the_upstream_reads_what_the_client_sent(
    differential: tuple[Proxy, H11Upstream], requests: list[bytes], cuts: list[int]
) -> None:
    server, upstream = differential
    upstream.requests.clear()
    upstream.errors.clear()
    stream = b"".join(requests) + END
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    at = 0
    for cut in cuts:
        writer.write(stream[at : at + cut])
        await writer.drain()
        at += cut
    writer.write(stream[at:])
    received = b""
    with contextlib.suppress(ConnectionError):
        async with asyncio.timeout(10):
            while data := await reader.read(65536):
                received += data
    writer.close()
    # Everything the proxy forwarded has been answered: the client saw every response.
    await asyncio.sleep(0)

    default_host = server.routes["default/app"].default_host
    expected = _as_h11_reads(stream, default_host)
    forwarded = [_Seen(r.method, r.target, next(iter(r.header(b"host")), b"<none>"), r.body) for r in upstream.requests]
    answers = _final_responses(received)
    assert upstream.errors == [], "the proxy sent the upstream bytes h11 cannot read"
    assert forwarded == expected[: len(forwarded)], "the upstream read requests the client did not send"
    assert [own for own in answers if not own] == [False] * len(forwarded), "one response per forwarded request"
    if not any(answers):
        # The proxy refused nothing: then it forwarded everything h11 read.
        assert len(forwarded) == len(expected)


# --- the response side: what the client reads (with h11) is what the upstream sent, or the proxy's 502 ---

_RESPONSE_HOSTILE = [
    b"X-A: plain",
    b"X-A:  padded ",
    b"Connection: keep-alive",
    b"Connection: x-a",
    b"Connection: content-length",
    b"Connection: transfer-encoding",
    b"Keep-Alive: timeout=5",
    b"Transfer-Encoding: gzip",
    b"Content-Length: 3",
    b"Trailer: X-T",
    b"Upgrade: h2c",
]


# Trailer lines of a chunked response (never in a head: a client that sees one got another response's trailers).
_TRAILERS = [b"X-Trailer: 1", b"Set-Cookie: trailer=1", b"Content-Length: 7"]
# What a broken upstream may send past the end of a response: it must never answer the next request.
_AFTER = [b"", b"", b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nEVIL", b"HTTP/1.1 2", b"junk", b"\r\n"]


@st.composite
def _response(draw: st.DrawFn) -> tuple[bytes, bytes]:
    """(a response, what the upstream sends after it on the same connection)."""
    status = draw(st.sampled_from([200, 201, 204, 404, 500]))
    body = b"" if status == 204 else draw(st.binary(max_size=40))
    lines = draw(st.lists(st.sampled_from(_RESPONSE_HOSTILE), max_size=2))
    if status != 204 and draw(st.booleans()):
        lines.append(b"Transfer-Encoding: chunked")
        trailers = draw(st.lists(st.sampled_from(_TRAILERS), max_size=2))
        payload = (b"%x\r\n%b\r\n" % (len(body), body) if body else b"") + b"0\r\n"
        payload += b"".join(line + b"\r\n" for line in trailers) + b"\r\n"
    else:
        lines.append(b"Content-Length: %d" % len(body))
        payload = body
    lines = draw(st.permutations(lines))
    head = b"HTTP/1.1 %d X\r\n%b\r\n" % (status, b"".join(line + b"\r\n" for line in lines))
    return head + payload, draw(st.sampled_from(_AFTER))


def _as_h11_response(raw: bytes) -> tuple[int, bytes] | None:
    """(status, body) as h11 reads `raw` in answer to a GET, or None if h11 cannot read it whole."""
    connection = h11.Connection(h11.CLIENT)
    connection.send(h11.Request(method="GET", target="/", headers=[("Host", "a")]))
    connection.send(h11.EndOfMessage())
    connection.receive_data(raw)
    status, body = 0, b""
    try:
        while True:
            event = connection.next_event()
            if isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                return status, body
            else:
                return None
    except h11.RemoteProtocolError:
        return None


@pytest.fixture
async def scripted() -> AsyncIterator[tuple[Proxy, H11Upstream, list[bytes]]]:
    replies: list[bytes] = []
    upstream = await H11Upstream(reply=lambda _request: replies.pop(0)).start()
    async with running_proxy([route("app", upstream.address)], header_timeout=1, idle_timeout=1) as server:
        yield server, upstream, replies
    await upstream.stop()


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(responses=st.lists(_response(), min_size=1, max_size=5))
async def test_the_client_reads_what_the_upstream_sent(
    scripted: tuple[Proxy, H11Upstream, list[bytes]], responses: list[tuple[bytes, bytes]]
) -> None:
    """Each response on the pooled upstream connection reaches its own client request: never its trailers in
    the next one's head, never bytes sent after it as the next one's answer."""
    server, _upstream, replies = scripted
    replies[:] = [raw + after for raw, after in responses]
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    client = h11.Connection(h11.CLIENT)
    try:
        for raw, _after in responses:
            expected = _as_h11_response(raw)
            writer.write(client.send(h11.Request(method="GET", target="/", headers=[("Host", "app.example")])))
            writer.write(client.send(h11.EndOfMessage()))
            status, body, own = 0, b"", False
            async with asyncio.timeout(5):
                while True:
                    event = client.next_event()
                    if event is h11.NEED_DATA:
                        client.receive_data(await reader.read(65536))
                    elif isinstance(event, h11.Response):
                        status = event.status_code
                        own = any(name == b"x-zeroscale-proxy" for name, _ in event.headers)
                        leaked = {name for name, _ in event.headers} & {b"x-trailer", b"set-cookie"}
                        assert not leaked, f"trailers in a response head: {leaked}"
                    elif isinstance(event, h11.Data):
                        body += event.data
                    elif isinstance(event, h11.EndOfMessage):
                        break
                    else:
                        raise AssertionError(f"unexpected {event!r}")
            if own:
                assert status == 502, "the proxy's own answer to a response it cannot forward"
            else:
                assert expected is not None, "the proxy forwarded a response h11 cannot read"
                assert (status, body) == expected
            if client.our_state is not h11.DONE or client.their_state is not h11.DONE:
                break
            client.start_next_cycle()
    finally:
        writer.close()
