"""The proxy's security cases run on the proxy tests' fixtures: uvloop, a real upstream, the proxy in-process;
and on an upstream that reads what the proxy forwards with h11 (a parser independent of the proxy's)."""

from collections.abc import AsyncIterator

import pytest

from adapter.proxy.app import Proxy
from tests.fixtures.proxy import no_loop_errors, proxy, pytest_asyncio_loop_factories, route, running_proxy, upstream
from tests.security.h11_upstream import H11Upstream

__all__ = ["h11_proxy", "h11_upstream", "no_loop_errors", "proxy", "pytest_asyncio_loop_factories", "upstream"]


@pytest.fixture
async def h11_upstream() -> AsyncIterator[H11Upstream]:
    app = await H11Upstream().start()
    yield app
    await app.stop()


@pytest.fixture
async def h11_proxy(h11_upstream: H11Upstream) -> AsyncIterator[Proxy]:
    async with running_proxy([route("app", h11_upstream.address)]) as server:
        yield server
