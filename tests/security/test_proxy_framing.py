"""Framing and routing headers a peer names in Connection, transfer codings, Host: both directions,
on a pooled keep-alive upstream connection (where a mis-framed body becomes the next request)."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import REGISTRY

from adapter.proxy.app import Proxy
from tests.fixtures.proxy import get, post, read_response, request, route, running_proxy
from tests.fixtures.upstream_app import Upstream
from tests.security.h11_upstream import H11Upstream

SMUGGLED = b"GET /admin HTTP/1.1\r\nHost: app.example\r\nX-Smuggled: 1\r\n\r\n"


def _refused(side: str, reason: str) -> float:
    value = REGISTRY.get_sample_value("zeroscale_proxy_refused_messages_total", {"side": side, "reason": reason})
    return value or 0.0


async def _pool_one_connection(server: Proxy, upstream: H11Upstream) -> None:
    """A first request leaves one idle keep-alive connection in the pool: the next request reuses it."""
    assert (await request(server.port, get("/first"))).status == 200
    assert upstream.connections == 1


def _named(option: str, body: bytes, chunked: bool = False) -> bytes:
    if chunked:
        framed = b"%x\r\n%b\r\n0\r\n\r\n" % (len(body), body)
        return b"POST /echo HTTP/1.1\r\nHost: app.example\r\nTransfer-Encoding: chunked\r\n%b\r\n\r\n%b" % (
            option.encode(),
            framed,
        )
    return b"POST /echo HTTP/1.1\r\nHost: app.example\r\nContent-Length: %d\r\n%b\r\n\r\n%b" % (
        len(body),
        option.encode(),
        body,
    )


CONNECTION_OPTIONS = [
    "Connection: content-length",
    "Connection: Content-Length",
    "Connection:  content-length  ",
    "Connection: keep-alive, Content-Length",
    "Connection: keep-alive\r\nConnection: content-length",
    "Connection: host",
    "Connection: transfer-encoding",
    "Connection: close, Host",
]


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
@pytest.mark.parametrize("option", CONNECTION_OPTIONS)
async def test_a_request_naming_a_framing_header_in_connection_is_400_and_forwards_nothing(
    h11_proxy: Proxy, h11_upstream: H11Upstream, option: str, chunked: bool
) -> None:
    await _pool_one_connection(h11_proxy, h11_upstream)
    before = _refused("request", "connection_names_framing")
    response = await request(h11_proxy.port, _named(option, SMUGGLED, chunked))
    assert response.status == 400
    assert b"never dropped" in response.body
    assert _refused("request", "connection_names_framing") == before + 1
    # The pooled connection still carries exactly the requests clients sent, framed as they were.
    assert (await request(h11_proxy.port, post(b"after"))).body == b"after"
    assert [(r.method, r.target, r.body) for r in h11_upstream.requests] == [
        (b"GET", b"/first", b""),
        (b"POST", b"/echo", b"after"),
    ]
    assert h11_upstream.errors == []


async def test_other_connection_options_are_dropped_and_framing_is_the_proxys_own(
    h11_proxy: Proxy, h11_upstream: H11Upstream
) -> None:
    await _pool_one_connection(h11_proxy, h11_upstream)
    raw = _named("Connection: keep-alive, X-Drop-Me\r\nX-Drop-Me: 1\r\nX-Keep: 2", b"hello")
    response = await request(h11_proxy.port, raw)
    assert response.status == 200
    assert response.body == b"hello"
    seen = h11_upstream.requests[-1]
    assert seen.header(b"x-drop-me") == []
    assert seen.header(b"x-keep") == [b"2"]
    assert seen.header(b"content-length") == [b"5"]
    assert seen.header(b"host") == [b"app.example"]
    assert h11_upstream.connections == 1


# --- the response side: an upstream's framing is never dropped either ---


def _reply_naming(option: bytes) -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n%b\r\n\r\nhelloHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n" % option
    )


RESPONSE_CASES = {
    "connection-content-length": _reply_naming(b"Connection: content-length"),
    "connection-content-length-spaces": _reply_naming(b"Connection: keep-alive , Content-Length "),
    "connection-transfer-encoding": _reply_naming(b"Connection: transfer-encoding"),
    "connection-host": _reply_naming(b"Connection: host"),
    "coding-not-chunked": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nhello",
    "coding-chunked-lookalike": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: xchunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
}


@pytest.mark.parametrize("reply", RESPONSE_CASES.values(), ids=RESPONSE_CASES.keys())
async def test_a_response_with_untrustworthy_framing_is_502_and_its_connection_never_pooled(reply: bytes) -> None:
    replies = iter([b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", reply])
    upstream = await H11Upstream(
        reply=lambda _request: next(replies, b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nnext")
    ).start()
    try:
        async with running_proxy([route("app", upstream.address)]) as server:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(get("/first"))
            assert (await asyncio.wait_for(read_response(reader), 5)).body == b"ok"
            writer.write(get("/bad"))
            bad = await asyncio.wait_for(read_response(reader), 5)
            writer.close()
            assert bad.status == 502
            assert bad.headers["x-zeroscale-proxy"] == "error"
            # The connection that carried the bad response is closed: the next request gets a new one.
            follow = await request(server.port, get("/next"))
            assert follow.body == b"next"
            assert [r.target for r in upstream.requests] == [b"/first", b"/bad", b"/next"]
            assert [r.connection for r in upstream.requests] == [1, 1, 2]
    finally:
        await upstream.stop()


async def test_a_refused_response_is_counted() -> None:
    upstream = await H11Upstream(reply=lambda _r: _reply_naming(b"Connection: content-length")).start()
    try:
        async with running_proxy([route("app", upstream.address)]) as server:
            before = _refused("response", "connection_names_framing")
            assert (await request(server.port, get())).status == 502
            assert _refused("response", "connection_names_framing") == before + 1
    finally:
        await upstream.stop()


# --- transfer codings (RFC 9112 6.1, 6.3) ---

CODINGS = {
    # chunked must be the final coding, a request's length cannot be known otherwise: 400.
    "chunked-not-last": (b"Transfer-Encoding: chunked, gzip", 400),
    "chunked-not-last-two-lines": (b"Transfer-Encoding: chunked\r\nTransfer-Encoding: gzip", 400),
    "only-gzip": (b"Transfer-Encoding: gzip", 400),
    # A coding the proxy does not implement before chunked: 501.
    "gzip-then-chunked": (b"Transfer-Encoding: gzip, chunked", 501),
    "gzip-then-chunked-two-lines": (b"Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked", 501),
    # With Content-Length too: the classic desync.
    "length-and-chunked": (b"Transfer-Encoding: chunked\r\nContent-Length: 5", 400),
}


@pytest.mark.parametrize(("header", "status"), CODINGS.values(), ids=CODINGS.keys())
async def test_request_transfer_codings_other_than_a_lone_chunked_are_refused(
    h11_proxy: Proxy, h11_upstream: H11Upstream, header: bytes, status: int
) -> None:
    raw = b"POST /echo HTTP/1.1\r\nHost: a\r\n%b\r\n\r\n5\r\nhello\r\n0\r\n\r\n" % header
    response = await request(h11_proxy.port, raw)
    assert response.status in (status, 400)  # llhttp refuses some of these itself, as malformed
    assert h11_upstream.requests == []


async def test_transfer_encoding_in_an_http10_request_is_400(h11_proxy: Proxy, h11_upstream: H11Upstream) -> None:
    raw = b"POST /echo HTTP/1.0\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
    response = await request(h11_proxy.port, raw)
    assert response.status == 400
    assert h11_upstream.requests == []


# --- Host: from the authority of an absolute-form target, trimmed, and valid ---


async def test_absolute_form_http10_without_host_forwards_the_authority_as_host(
    h11_proxy: Proxy, h11_upstream: H11Upstream
) -> None:
    response = await request(h11_proxy.port, b"GET http://web.test/x?y=1 HTTP/1.0\r\n\r\n")
    assert response.status == 200
    seen = h11_upstream.requests[0]
    assert seen.target == b"/x?y=1"
    assert seen.header(b"host") == [b"web.test"]


@pytest.mark.parametrize(
    ("target", "path"),
    [(b"http://web.test/x", b"/x"), (b"http://web.test", b"/"), (b"http://web.test?q=1", b"/?q=1")],
)
async def test_the_authority_wins_over_the_host_header(
    h11_proxy: Proxy, h11_upstream: H11Upstream, target: bytes, path: bytes
) -> None:
    response = await request(h11_proxy.port, b"GET %b HTTP/1.1\r\nHost: other.test\r\n\r\n" % target)
    assert response.status == 200
    seen = h11_upstream.requests[0]
    assert (seen.target, seen.header(b"host"), seen.header(b"x-forwarded-host")) == (
        path,
        [b"web.test"],
        [b"web.test"],
    )


@pytest.mark.parametrize(
    "raw",
    [
        b"GET http://user@web.test/x HTTP/1.1\r\nHost: web.test\r\n\r\n",
        b"GET http:///x HTTP/1.1\r\nHost: web.test\r\n\r\n",
        b"GET /x HTTP/1.1\r\nHost: web.test/evil\r\n\r\n",
        b"GET /x HTTP/1.1\r\nHost: a b\r\n\r\n",
        b"GET /x HTTP/1.1\r\nHost: web.test\x80\r\n\r\n",
    ],
)
async def test_a_host_that_is_not_a_host_is_400(h11_proxy: Proxy, h11_upstream: H11Upstream, raw: bytes) -> None:
    assert (await request(h11_proxy.port, raw)).status == 400
    assert h11_upstream.requests == []


async def test_values_the_proxy_reads_are_trimmed(proxy: Proxy, upstream: Upstream) -> None:
    # Host with trailing whitespace is the same host; X-Forwarded-For and Upgrade are forwarded trimmed.
    response = await request(
        proxy.port, b"GET /echo HTTP/1.1\r\nHost: app.example \t\r\nX-Forwarded-For: 10.0.0.1  \r\n\r\n"
    )
    assert response.status == 200
    seen = upstream.requests[0]
    assert seen.headers["host"] == "app.example"
    assert seen.headers["x-forwarded-host"] == "app.example"
    assert seen.headers["x-forwarded-for"] == "10.0.0.1, 127.0.0.1"
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    writer.write(b"GET /ws HTTP/1.1\r\nHost: a\r\nUpgrade: websocket \t\r\nConnection: Upgrade \r\n\r\n")
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    writer.close()
    assert head.startswith(b"HTTP/1.1 101")
    assert upstream.requests[1].headers["upgrade"] == "websocket"


async def test_a_malformed_response_is_502_and_not_retried() -> None:
    # Bytes came back: the upstream acted on the request, so even an idempotent one is not sent again.
    replies = iter([b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\nContent-Length: 0\r\n\r\n"])
    upstream = await H11Upstream(
        reply=lambda _r: next(replies, b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
    ).start()
    try:
        async with running_proxy([route("app", upstream.address)]) as server:
            response = await request(server.port, get())
            assert response.status == 502
            assert len(upstream.requests) == 1
    finally:
        await upstream.stop()


async def test_a_clients_forwarded_header_gets_the_hop_the_proxy_saw_appended(
    h11_proxy: Proxy, h11_upstream: H11Upstream
) -> None:
    # An app reading the last element of Forwarded (RFC 7239) sees the address the proxy saw, not a claim.
    raw = b"GET /echo HTTP/1.1\r\nHost: app.example\r\nForwarded: for=203.0.113.9 \r\nForwarded: for=10.0.0.1\r\n\r\n"
    assert (await request(h11_proxy.port, raw)).status == 200
    assert h11_upstream.requests[0].header(b"forwarded") == [b"for=203.0.113.9, for=10.0.0.1, for=127.0.0.1;proto=http"]


async def test_underscore_spellings_of_headers_the_proxy_owns_are_not_forwarded(
    h11_proxy: Proxy, h11_upstream: H11Upstream
) -> None:
    """A CGI or WSGI server maps `_` and `-` in a header name alike (HTTP_X_FORWARDED_FOR): these would spoof the
    forwarding headers the proxy sets, or reach the app as framing it never saw."""
    aliases = [
        b"X_Forwarded_For: 6.6.6.6",
        b"x_forwarded_host: evil.example",
        b"X-Forwarded_Proto: https",
        b"Content_Length: 99",
        b"Transfer_Encoding: chunked",
        b"Proxy_Authorization: Basic Zm9vOmJhcg==",
        b"Keep_Alive: 1",
    ]
    raw = post(b"hello", extra="".join(f"{line.decode()}\r\n" for line in [*aliases, b"X_App_Thing: kept"]))
    response = await request(h11_proxy.port, raw)
    assert (response.status, response.body) == (200, b"hello")
    [seen] = h11_upstream.requests
    names = [name for name, _ in seen.headers]
    assert not [name for name in names if b"_" in name and name != b"x_app_thing"]
    assert seen.header(b"x_app_thing") == [b"kept"]
    assert seen.header(b"x-forwarded-for") == [b"127.0.0.1"]


async def test_an_http10_expect_is_ignored_not_answered_with_100(h11_proxy: Proxy) -> None:
    """An HTTP/1.0 client knows no interim answers: a 100 would be read as its response, the real one after it
    as garbage."""
    reader, writer = await asyncio.open_connection("127.0.0.1", h11_proxy.port)
    writer.write(b"POST /echo HTTP/1.0\r\nHost: app.example\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n")
    await asyncio.sleep(0.2)
    writer.write(b"hello")
    response = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    assert response.startswith(b"HTTP/1.1 200")
    assert b" 100 " not in response
