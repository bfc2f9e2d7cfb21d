"""The proxy tests run on the shared proxy fixtures (tests/fixtures/proxy.py): uvloop, a real upstream, the proxy
in-process; the counts stream's tests on the count-stream server of tests/fixtures/grpc_servers.py."""

from tests.fixtures.grpc_servers import start_counts
from tests.fixtures.proxy import kube_client, no_loop_errors, proxy, pytest_asyncio_loop_factories, upstream

__all__ = ["kube_client", "no_loop_errors", "proxy", "pytest_asyncio_loop_factories", "start_counts", "upstream"]
