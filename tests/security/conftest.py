"""The proxy's security cases run on the proxy tests' fixtures: uvloop, a real upstream, the proxy in-process."""

from tests.proxy.conftest import no_loop_errors, proxy, pytest_asyncio_loop_factories, upstream

__all__ = ["no_loop_errors", "proxy", "pytest_asyncio_loop_factories", "upstream"]
