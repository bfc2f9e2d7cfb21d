"""Sampling the demo a few times a second: each workload's replicas, and the requests the proxy holds.

Held requests come from the proxy's own Prometheus gauge on its admin port, the number a dashboard shows.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from prometheus_client.parser import text_string_to_metric_families

from adapter.demo.stack import HOST
from adapter.demo.timeline import Sample, Timeline
from adapter.demo.workloads import LocalWorkload

HELD_GAUGE = "zeroscale_proxy_held_requests"
_SCRAPE_TIMEOUT = 2.0


def held_from_exposition(text: str, route: str) -> int | None:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == HELD_GAUGE and sample.labels.get("route") == route:
                return int(sample.value)
    return None


async def held_requests(admin_port: int, route: str) -> int | None:
    """The proxy's held-request gauge for `route`; None when the admin port does not answer."""
    try:
        async with asyncio.timeout(_SCRAPE_TIMEOUT):
            reader, writer = await asyncio.open_connection(HOST, admin_port)
            writer.write(b"GET /metrics HTTP/1.1\r\nHost: proxy\r\nConnection: close\r\n\r\n")
            response = await reader.read()
            writer.close()
    except (OSError, TimeoutError):
        return None
    _, _, body = response.partition(b"\r\n\r\n")
    return held_from_exposition(body.decode("utf-8", "replace"), route)


async def sample_forever(
    timeline: Timeline, workloads: Mapping[str, LocalWorkload], admin_port: int, period: float = 0.25
) -> None:
    while True:
        held = await held_requests(admin_port, "web")
        timeline.samples.append(
            Sample(
                timeline.now(),
                {name: w.spec_replicas for name, w in workloads.items()},
                {name: w.ready_replicas for name, w in workloads.items()},
                held,
            )
        )
        await asyncio.sleep(period)
