"""The warm path: what reaches the upstream, what comes back, and keep-alive on both sides."""

from __future__ import annotations

import asyncio

from adapter.proxy.app import Proxy
from tests.fixtures.proxy import get, post, read_response, request
from tests.fixtures.upstream_app import Upstream


async def test_get_is_forwarded_with_forwarding_headers(proxy: Proxy, upstream: Upstream) -> None:
    response = await request(proxy.port, get("/echo?x=1", extra="X-Forwarded-Proto: https\r\nKeep-Alive: 5\r\n"))
    assert response.status == 200
    assert response.headers["x-seen-path"] == "/echo?x=1"
    assert response.headers["x-seen-x-forwarded-for"] == "127.0.0.1"
    assert response.headers["x-seen-x-forwarded-proto"] == "http"
    assert response.headers["x-seen-x-forwarded-host"] == "app.example"
    assert response.headers["x-seen-host"] == "app.example"  # the target's authority replaces Host
    assert response.headers["x-seen-host"] == "app.example"
    seen = upstream.requests[0]
    assert "keep-alive" not in seen.headers
    assert "x-zeroscale-cold-start" not in response.headers


async def test_existing_forwarded_for_is_appended_to(proxy: Proxy) -> None:
    response = await request(proxy.port, get(extra="X-Forwarded-For: 10.0.0.1\r\n"))
    assert response.headers["x-seen-x-forwarded-for"] == "10.0.0.1, 127.0.0.1"


async def test_headers_named_in_connection_are_dropped(proxy: Proxy, upstream: Upstream) -> None:
    await request(proxy.port, get(extra="Connection: x-secret\r\nX-Secret: 1\r\nX-Kept: 2\r\n"))
    seen = upstream.requests[0].headers
    assert "x-secret" not in seen
    assert seen["x-kept"] == "2"


async def test_post_body_content_length_and_chunked(proxy: Proxy, upstream: Upstream) -> None:
    body = b"x" * 100_000
    response = await request(proxy.port, post(body))
    assert response.status == 200
    assert response.body == body
    chunked = (
        b"POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
    )
    response = await request(proxy.port, chunked)
    assert response.body == b"hello world"
    assert upstream.requests[-1].headers["transfer-encoding"] == "chunked"


async def test_chunked_and_close_delimited_responses(proxy: Proxy) -> None:
    response = await request(proxy.port, post(b"abcdef", "/echo?chunked=1"))
    assert response.body == b"abcdef"
    assert response.headers["transfer-encoding"] == "chunked"
    response = await request(proxy.port, post(b"until close", "/echo?close=1"))
    assert response.body == b"until close"
    # Re-framed as chunked for an HTTP/1.1 client, so its connection could be kept.
    assert response.headers["transfer-encoding"] == "chunked"


async def test_head_response_has_no_body_and_connection_is_reused(proxy: Proxy, upstream: Upstream) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    writer.write(post(b"12345").replace(b"POST", b"HEAD", 1))
    head = await read_response(reader, head_only=True)
    assert head.status == 200
    assert head.headers["content-length"] == "5"
    writer.write(get("/echo?after-head"))
    response = await read_response(reader)
    assert response.headers["x-seen-path"] == "/echo?after-head"
    writer.close()
    # The client's connection was reused; the upstream's was not, as the HEAD carried a body (a server that
    # ignored it would have read it as the next request).
    assert upstream.connections == 2


async def test_keep_alive_on_both_sides(proxy: Proxy, upstream: Upstream) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    for index in range(50):
        writer.write(post(b"n%d" % index))
        response = await read_response(reader)
        assert response.body == b"n%d" % index
    writer.close()
    assert upstream.connections == 1


async def test_pipelined_requests_are_answered_in_order(proxy: Proxy) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    writer.write(b"".join(post(b"p%d" % i, path=f"/slow?s={0.05 if i == 0 else 0}") for i in range(5)))
    for index in range(5):
        response = await read_response(reader)
        assert response.body == b"p%d" % index
    writer.close()


async def test_expect_continue_is_answered_by_the_proxy(proxy: Proxy) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    writer.write(b"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n")
    interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert interim.startswith(b"HTTP/1.1 100")
    writer.write(b"body")
    response = await read_response(reader)
    assert response.status == 200
    assert response.body == b"body"
    writer.close()


async def test_unknown_host_gets_404_from_the_proxy(upstream: Upstream) -> None:
    from tests.fixtures.proxy import route, running_proxy

    async with running_proxy([route("only", upstream.address, hosts=["app.example", "*.apps.example"])]) as server:
        assert (await request(server.port, get(host="other.example"))).status == 404
        assert (await request(server.port, get(host="x.apps.example:8080"))).status == 200
        assert (await request(server.port, get(host="APP.example"))).status == 200
    assert len(upstream.requests) == 2


async def test_longest_path_prefix_wins(upstream: Upstream) -> None:
    from tests.fixtures.proxy import route, running_proxy

    other = await Upstream().start()
    try:
        routes = [route("root", upstream.address), route("api", other.address, path_prefix="/echo/api")]
        async with running_proxy(routes) as server:
            await request(server.port, get("/echo/api/v1"))
            await request(server.port, get("/echo/apiary"))
            await request(server.port, get("/echo"))
        assert [r.path for r in other.requests] == ["/echo/api/v1"]
        assert [r.path for r in upstream.requests] == ["/echo/apiary", "/echo"]
    finally:
        await other.stop()


async def test_http10_client_and_absolute_form_target(proxy: Proxy, upstream: Upstream) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    writer.write(b"GET /echo?old HTTP/1.0\r\n\r\n")
    data = await asyncio.wait_for(reader.read(), 5)  # HTTP/1.0 without keep-alive: closed after the answer
    writer.close()
    assert data.startswith(b"HTTP/1.1 200")
    # No Host from the client: the upstream gets the configured address as Host.
    assert upstream.requests[-1].headers["host"] == upstream.address
    response = await request(proxy.port, b"GET http://app.example/echo?absolute HTTP/1.1\r\nHost: ignored\r\n\r\n")
    assert response.headers["x-seen-path"] == "/echo?absolute"
    assert response.headers["x-seen-x-forwarded-host"] == "app.example"
