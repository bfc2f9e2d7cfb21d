"""Benchmark: from the first request a proxy holds to (a) the value in every adapter's external metrics API
and (b) a StreamIsActive message at a subscribed KEDA-like client.

    python perf/activation_bench.py [--rounds 100] [--proxies 3] [--adapters 2]

Starts the proxy and adapter replicas as processes on loopback (tests/fixtures/replicas.py: each proxy's
upstream never answers, so every request is held). Each round opens a connection to one proxy (round
robin), then sends one request at t0 and waits until every adapter's API reads 1 (keep-alive HTTPS
polls, back to back) and the stream says active; the round's latency is the slowest of those. The
client then leaves, and the round ends once everything reads 0 / inactive again.

Baseline, in the same run: the same request, until the proxy's own /metrics (admin port) shows it
held, polled the same way: the floor set by request handling and polling. Prints p50/p99 of each
path, the ratio to the baseline, and last `activation_p99_ms=<x>`. Goal: p99 <= 50 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import ssl
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
import uvloop

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from adapter.rpc.generated import externalscaler_pb2 as pb  # noqa: E402
from adapter.rpc.generated import externalscaler_pb2_grpc as pb_grpc  # noqa: E402
from tests.fixtures.httpclient import read_answer, request_bytes  # noqa: E402
from tests.fixtures.replicas import (  # noqa: E402
    METRIC_PATH,
    Process,
    start_adapter,
    start_proxy,
    stop_all,
    wait_until_listening,
)

_HELD_LINE = b'zeroscale_proxy_held_requests{route="web"} '


class APIPoller:
    """One keep-alive HTTPS connection to one adapter's external metrics API."""

    def __init__(self, port: int) -> None:
        self._port = port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def value(self) -> int:
        if self._writer is None:
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
            self._reader, self._writer = await asyncio.open_connection("127.0.0.1", self._port, ssl=context)
        assert self._reader is not None
        self._writer.write(request_bytes(METRIC_PATH))
        answer = await read_answer(self._reader)
        if answer.status != 200:
            raise RuntimeError(f"adapter answered {answer.status}: {answer.body[:200]!r}")
        return int(answer.json()["items"][0]["value"])

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


async def proxy_held(admin_port: int) -> int:
    """The proxy's own count, from its Prometheus endpoint (one connection per read: it closes after each)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", admin_port)
    writer.write(b"GET /metrics HTTP/1.1\r\nHost: admin\r\n\r\n")
    body = await reader.read()
    writer.close()
    start = body.index(_HELD_LINE) + len(_HELD_LINE)
    return int(float(body[start : body.index(b"\n", start)]))


async def until(read: Callable[[], Awaitable[int]], expected: int) -> float:
    """Read back to back until `expected`; the time it was first seen."""
    while await read() != expected:
        pass
    return time.perf_counter()


async def stream_until(queue: asyncio.Queue[tuple[bool, float]], expected: bool) -> float:
    while True:
        active, at = await queue.get()
        if active is expected:
            return at


async def follow_stream(port: int, queue: asyncio.Queue[tuple[bool, float]]) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.ExternalScalerStub(channel)  # type: ignore[no-untyped-call]
        metadata = {"metricName": "http-requests-pending", "labelSelector": "route=web"}
        scaled = pb.ScaledObjectRef(name="bench", namespace="default", scalerMetadata=metadata)
        async for message in stub.StreamIsActive(scaled):
            queue.put_nowait((message.result, time.perf_counter()))


async def open_client(proxy: Process) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", proxy.ports["http"])


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


async def run(rounds: int, proxies: list[Process], adapters: list[Process]) -> None:
    pollers = [APIPoller(adapter.ports["https"]) for adapter in adapters]
    stream: asyncio.Queue[tuple[bool, float]] = asyncio.Queue()
    follower = asyncio.create_task(follow_stream(adapters[0].ports["grpc"], stream))
    try:
        # Ready: every adapter has heard every proxy.
        await asyncio.gather(*(until(poller.value, 0) for poller in pollers))
        await stream_until(stream, False)
        api_ms: list[float] = []
        push_ms: list[float] = []
        both_ms: list[float] = []
        base_ms: list[float] = []
        for index in range(rounds):
            proxy = proxies[index % len(proxies)]
            # Ours: held -> every adapter's API and the stream.
            _, writer = await open_client(proxy)
            await asyncio.sleep(0.01)
            t0 = time.perf_counter()
            writer.write(b"GET / HTTP/1.1\r\nHost: web.test\r\n\r\n")
            seen = await asyncio.gather(*(until(poller.value, 1) for poller in pollers), stream_until(stream, True))
            api_ms.append((max(seen[:-1]) - t0) * 1000)
            push_ms.append((seen[-1] - t0) * 1000)
            both_ms.append((max(seen) - t0) * 1000)
            writer.close()
            await asyncio.gather(*(until(poller.value, 0) for poller in pollers), stream_until(stream, False))
            # Baseline: held -> the proxy's own metrics endpoint.
            _, writer = await open_client(proxy)
            await asyncio.sleep(0.01)
            t0 = time.perf_counter()
            writer.write(b"GET / HTTP/1.1\r\nHost: web.test\r\n\r\n")
            admin = functools.partial(proxy_held, proxy.ports["admin"])
            base_ms.append((await until(admin, 1) - t0) * 1000)
            writer.close()
            await asyncio.gather(*(until(poller.value, 0) for poller in pollers), stream_until(stream, False))
    finally:
        follower.cancel()
        with contextlib.suppress(BaseException):
            await follower
        for poller in pollers:
            poller.close()

    def line(name: str, values: list[float]) -> str:
        return f"{name:<38} p50={statistics.median(values):7.2f} ms  p99={percentile(values, 0.99):7.2f} ms"

    print(f"{rounds} rounds, {len(proxies)} proxies, {len(adapters)} adapters, loopback")
    print(line("baseline: proxy's own /metrics", base_ms))
    print(line(f"(a) API of all {len(adapters)} adapters", api_ms))
    print(line("(b) StreamIsActive message", push_ms))
    print(line("activation: slowest of (a) and (b)", both_ms))
    p99 = percentile(both_ms, 0.99)
    print(f"ratio_p99_vs_baseline={p99 / percentile(base_ms, 0.99):.2f}")
    print(f"activation_p99_ms={p99:.2f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--proxies", type=int, default=3)
    parser.add_argument("--adapters", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="zeroscale-activation-") as directory:
        proxies = [start_proxy(f"proxy-{i}", Path(directory)) for i in range(args.proxies)]
        adapters = [start_adapter(f"adapter-{i}", Path(directory), proxies) for i in range(args.adapters)]
        try:
            wait_until_listening(proxies + adapters)
            uvloop.run(run(args.rounds, proxies, adapters))
        finally:
            stop_all(adapters + proxies)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
