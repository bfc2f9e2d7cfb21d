"""These tests run on the shared gRPC fixtures (tests/fixtures/grpc_servers.py): the adapter and count-stream
servers in-process on uvloop, KEDA-like clients."""

from tests.fixtures.grpc_servers import (
    make_cache,
    pytest_asyncio_loop_factories,
    scaler_channel,
    start_adapter,
    start_counts,
)

__all__ = ["make_cache", "pytest_asyncio_loop_factories", "scaler_channel", "start_adapter", "start_counts"]
