"""`zeroscale proxy` as a real process in sidecar mode (environment only), stopped with SIGTERM during a hold."""

from __future__ import annotations

import asyncio
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.fixtures.netutil import refused_port
from tests.fixtures.proxy import get, read_response, request
from tests.fixtures.replicas import spawn
from tests.fixtures.upstream_app import Upstream


@contextmanager
def proxy_process(
    upstream_port: int, grace: float, directory: Path
) -> Iterator[tuple[subprocess.Popen[bytes], int, int]]:
    env = {
        "ZEROSCALE_PROXY__SIDECAR__UPSTREAM": f"127.0.0.1:{upstream_port}",
        "ZEROSCALE_PROXY__BIND": "127.0.0.1",
        "ZEROSCALE_PROXY__PORT": "0",
        "ZEROSCALE_PROXY__ADMIN_BIND": "127.0.0.1",
        "ZEROSCALE_PROXY__ADMIN_PORT": "0",
        "ZEROSCALE_PROXY__GRACE_PERIOD": str(grace),
    }
    proxy = spawn("proxy", "proxy", directory, env=env)
    try:
        yield proxy.process, proxy.ports["http"], proxy.ports["admin"]
    finally:
        if proxy.process.poll() is None:
            proxy.process.kill()
        proxy.process.wait(10)


async def held(port: int, count: int, admin: int) -> list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    connections = []
    for index in range(count):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(get(f"/echo?n={index}"))
        connections.append((reader, writer))
    # Wait until the proxy holds them all (its own metric on the admin port).
    async with asyncio.timeout(10):
        while True:
            metrics = await request(admin, get("/metrics"))
            if f'zeroscale_proxy_held_requests{{route="default/sidecar"}} {count}.0'.encode() in metrics.body:
                return connections
            await asyncio.sleep(0.02)


async def test_sigterm_finishes_held_requests_within_the_grace_period(tmp_path: Path) -> None:
    upstream_port = refused_port()
    with proxy_process(upstream_port, grace=10, directory=tmp_path) as (process, port, admin):
        connections = await held(port, 5, admin)
        process.send_signal(signal.SIGTERM)
        await asyncio.sleep(0.2)
        # Draining: no new connections, not ready, but the held requests still wait.
        assert process.poll() is None
        upstream = await Upstream(upstream_port).start()
        try:
            responses = [await asyncio.wait_for(read_response(reader), 10) for reader, _ in connections]
        finally:
            for _, writer in connections:
                writer.close()
        assert [r.status for r in responses] == [200] * 5
        assert [r.headers["x-seen-path"] for r in responses] == [f"/echo?n={i}" for i in range(5)]
        assert all(r.headers["connection"] == "close" for r in responses)
        assert await asyncio.to_thread(process.wait, 10) == 0
        await upstream.stop()


async def test_sigterm_answers_what_is_left_after_the_grace_period_with_503(tmp_path: Path) -> None:
    with proxy_process(refused_port(), grace=0.5, directory=tmp_path) as (process, port, admin):
        connections = await held(port, 3, admin)
        process.send_signal(signal.SIGTERM)
        responses = [await asyncio.wait_for(read_response(reader), 10) for reader, _ in connections]
        for _, writer in connections:
            writer.close()
        assert [r.status for r in responses] == [503] * 3
        assert all(b"shutting down" in r.body for r in responses)
        assert await asyncio.to_thread(process.wait, 10) == 0
        try:
            await asyncio.open_connection("127.0.0.1", port)
            refused = False
        except OSError:
            refused = True
        assert refused
