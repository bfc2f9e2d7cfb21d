"""`zeroscale proxy`, wired: the buffering proxy (adapter/proxy/server.py) and, when enabled, the gRPC stream
of its pending counts that adapters read (adapter/proxy/counts_stream.py), on uvloop.

The composition root of the proxy process: what it starts goes on one AsyncExitStack, so teardown is setup
read backwards, with one deliberate exception written where it happens: the proxy's drain runs while the
counts stream still reports, so adapters see the held requests fall to zero rather than the stream vanish.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from pathlib import Path

from adapter.config.grpc import CountsServerConfig
from adapter.config.proxy import ProxyConfig
from adapter.fdlimit import raise_open_files_limit
from adapter.proxy.app import Proxy
from adapter.ready import address, announce

log = logging.getLogger(__name__)

# Upstream connections (pooled, bounded per endpoint), the admin port, the Kubernetes API.
_SPARE_DESCRIPTORS = 4096


async def serve(config: ProxyConfig, counts: CountsServerConfig | None = None, ready_file: Path | None = None) -> int:
    """Run until SIGTERM or SIGINT, then shut down gracefully; 1 if a port cannot be listened on. With
    `ready_file`, the bound ports are written there once every listener is up (adapter/ready.py)."""
    server = Proxy(config)
    try:
        await server.start()
    except OSError as err:
        # A port in use or a bad bind address: one line, as `serve` does, not a traceback.
        log.error("cannot listen: %s", err)
        await server.shutdown(grace=0)
        return 1
    async with contextlib.AsyncExitStack() as stack:
        bound = server.bound()
        if counts is not None and counts.enabled:
            from adapter.proxy.counts_stream import start_counts_server  # gRPC loads only when the stream is on

            counts_server = await start_counts_server(counts, server.subscribe)
            stack.push_async_callback(counts_server.stop)
            bound["counts"] = address(counts.bind, counts_server.port)
        # Pushed after the counts stream although started before it: the drain must run while it still reports.
        stack.push_async_callback(server.shutdown)
        stop = asyncio.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            asyncio.get_running_loop().add_signal_handler(signum, stop.set)
        if ready_file is not None:
            announce(stack, ready_file, bound)
        await stop.wait()
        log.info("signal received: draining for up to %gs", config.grace_period)
    return 0


def run_proxy(config: ProxyConfig, counts: CountsServerConfig | None = None, ready_file: Path | None = None) -> int:
    import uvloop

    if not config.effective_routes() and not config.route_objects.enabled:
        log.error(
            "no routes: set proxy.routes, proxy.route_objects.enabled (ZeroscaleRoute objects), or "
            "proxy.sidecar.upstream (ZEROSCALE_PROXY__SIDECAR__UPSTREAM)"
        )
        return 2
    # Each client connection takes a descriptor, and so does each pooled upstream connection.
    raise_open_files_limit(config.max_connections + _SPARE_DESCRIPTORS, f"max_connections={config.max_connections}")
    return uvloop.run(serve(config, counts, ready_file))
