"""Two adapter replicas and three proxy replicas as real processes: every adapter reports the same sum,
and a killed proxy that is still listed never makes the sum smaller (its requests are not known to be gone)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from adapter.rpc.generated import externalscaler_pb2 as pb
from tests.fixtures.grpc_servers import ref, scaler_stub
from tests.fixtures.replicas import (
    Process,
    api_value,
    send_requests,
    start_adapter,
    start_proxy,
    stop_all,
    wait_until_listening,
)


@pytest.fixture
def replicas(tmp_path: Path) -> Iterator[tuple[list[Process], list[Process]]]:
    proxies = [start_proxy(f"proxy-{i}", tmp_path) for i in range(3)]
    adapters = [start_adapter(f"adapter-{i}", tmp_path, proxies) for i in range(2)]
    try:
        wait_until_listening(proxies + adapters)
        yield proxies, adapters
    finally:
        stop_all(adapters + proxies)


async def keda_value(adapter: Process) -> float:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{adapter.ports['grpc']}") as channel:
        request = pb.GetMetricsRequest(
            scaledObjectRef=ref(metric="http-requests-pending", selector="route=web"),
            metricName="http-requests-pending",
        )
        value: float = (await scaler_stub(channel).GetMetrics(request)).metricValues[0].metricValueFloat
        return value


async def all_report(adapters: list[Process], expected: int, within: float) -> None:
    deadline = time.monotonic() + within
    while True:
        values = [await api_value(adapter) for adapter in adapters]
        if values == [expected] * len(adapters):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"adapters report {values}, not {expected} each, after {within}s")
        await asyncio.sleep(0.02)


async def test_every_adapter_sums_every_proxy(replicas: tuple[list[Process], list[Process]]) -> None:
    proxies, adapters = replicas
    await all_report(adapters, 0, within=10)
    held = [await send_requests(proxy.ports["http"], count) for proxy, count in zip(proxies, (1, 2, 3), strict=True)]
    await all_report(adapters, 6, within=5)
    assert [await keda_value(adapter) for adapter in adapters] == [6.0, 6.0]

    # A proxy dies while the list still names it: its 2 requests are not known to be gone, so no adapter
    # reports the smaller 4, well past stale_after (1.5 s); the cache serves its last good sum meanwhile.
    killed_at = time.monotonic()
    proxies[1].kill()
    seen = set()
    while time.monotonic() - killed_at < 3.5:
        seen |= {await api_value(adapter) for adapter in adapters}
        await asyncio.sleep(0.05)
    assert seen == {6}, f"values seen after a listed proxy died: {seen}"
    for writers in held:
        for writer in writers:
            writer.close()
