"""Which upgrades become tunnels: never one to HTTP itself, whose requests the proxy would not see."""

from __future__ import annotations

import pytest

from adapter.proxy.app import Proxy
from tests.fixtures.proxy import request, route, running_proxy
from tests.fixtures.upstream_app import Upstream
from tests.security.h11_upstream import H11Upstream

H2C = b"Connection: Upgrade, HTTP2-Settings\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n"


@pytest.mark.parametrize("protocols", [b"h2c", b"H2C", b"HTTP/2.0", b"h2c, HTTP/1.1", b"h2"])
async def test_an_upgrade_to_http_itself_is_forwarded_as_a_plain_request(
    h11_proxy: Proxy, h11_upstream: H11Upstream, protocols: bytes
) -> None:
    """An h2c tunnel would carry requests the proxy never parses: unrouted, uncounted, under no request limit."""
    raw = b"GET /x HTTP/1.1\r\nHost: app.example\r\nUpgrade: %b\r\n%b\r\nPRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" % (
        protocols,
        H2C,
    )
    response = await request(h11_proxy.port, raw)
    assert response.status == 200
    assert response.headers.get("connection") == "close"
    [seen] = h11_upstream.requests
    assert seen.header(b"upgrade") == []
    assert seen.header(b"http2-settings") == []
    assert h11_upstream.errors == []
    assert h11_proxy.routes["default/app"].tunnels == 0


async def test_other_protocols_in_the_list_are_still_upgraded_to(h11_proxy: Proxy, h11_upstream: H11Upstream) -> None:
    raw = b"GET /x HTTP/1.1\r\nHost: app.example\r\nUpgrade: h2c, websocket\r\n%b\r\n" % H2C
    await request(h11_proxy.port, raw)
    # h11 answers an upgrade it does not take with a plain response: what matters is what it was asked.
    [seen] = h11_upstream.requests
    assert seen.header(b"upgrade") == [b"websocket"]


async def test_an_upstream_switching_to_h2c_unasked_is_502(upstream: Upstream) -> None:
    """The test upstream's /ws switches protocols whatever it is asked: after a refused h2c upgrade, that is an
    upstream answering 101 to a plain request, and no tunnel opens."""
    async with running_proxy([route("app", upstream.address)]) as server:
        raw = b"GET /ws HTTP/1.1\r\nHost: a\r\nUpgrade: h2c\r\n%b\r\nPRI * HTTP/2.0\r\n\r\n" % H2C
        response = await request(server.port, raw)
        assert response.status == 502
        assert server.routes["default/app"].tunnels == 0
