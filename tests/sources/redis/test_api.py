"""End to end: `zeroscale serve` answers from Redis, and a push shows in the external metrics API within 100 ms."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from decimal import Decimal
from typing import Any

import pytest

from adapter.config import ZeroscaleConfig
from tests.fixtures.adapter_inprocess import start_serving
from tests.fixtures.httpclient import read_answer, request_bytes, tls_client
from tests.fixtures.redis_servers import RedisProcess

PATH = "/apis/external.metrics.k8s.io/v1beta1/namespaces/default/redis-jobs?labelSelector=key%3Djobs"


class Connection:
    """One keep-alive HTTPS connection to the adapter (no handshake per request)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def value(self) -> Decimal:
        self.writer.write(request_bytes(PATH))
        answer = await asyncio.wait_for(read_answer(self.reader), 10)
        assert answer.status == 200, answer.body
        items: list[dict[str, Any]] = answer.json()["items"]
        assert items[0]["metricLabels"] == {"key": "jobs"}
        return Decimal(items[0]["value"])


@pytest.fixture
async def adapter(server: RedisProcess) -> AsyncIterator[Connection]:
    config = ZeroscaleConfig(
        server={
            "bind": "127.0.0.1",
            "port": 0,
            "metrics_bind": "127.0.0.1",
            "metrics_port": 0,
            "auth": {"enabled": False},
        },
        sources=[{"name": "q", "type": "redis", "url": f"redis://{server.address}", "notifications": True}],
        metrics=[
            {
                "name": "redis-jobs",
                "type": "redis",
                "source": "q",
                "query": "length",
                "interval": "10m",  # polling alone would not refresh within the test
                "labels": {"key": {"pattern": "[a-z]+", "required": True}},
            }
        ],
    )
    serving = await start_serving(config)
    port = serving.ports["api"]
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=tls_client(), server_hostname="localhost")
    connection = Connection(reader, writer)
    yield connection
    connection.writer.close()
    serving.stop.set()
    assert await asyncio.wait_for(serving.task, 10) == 0


async def test_push_onto_an_empty_list_reaches_the_api_within_100ms(server: RedisProcess, adapter: Connection) -> None:
    server.client().config_set("notify-keyspace-events", "Kl")
    assert await adapter.value() == 0
    deadline = time.monotonic() + 10
    while server.client().pubsub_numsub("__keyspace@0__:jobs")[0][1] < 1:
        assert time.monotonic() < deadline, "the adapter never subscribed to the key"
        await asyncio.sleep(0.01)

    pushed = time.monotonic()
    server.client().lpush("jobs", "job-1")
    while await adapter.value() != 1:
        assert time.monotonic() - pushed < 5, "the push never reached the API"
        await asyncio.sleep(0.002)
    elapsed = time.monotonic() - pushed
    print(f"push visible in the API after {elapsed * 1000:.1f} ms")
    assert elapsed < 0.1
