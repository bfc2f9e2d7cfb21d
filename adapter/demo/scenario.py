"""The scripted story: idle at zero, HTTP requests held while the app wakes, jobs that wake the worker, back to zero.

`smoke` is the short version CI runs (the HTTP and job phases overlap); `full` tells it one step at a time.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from adapter.demo.load import browse, burst, request
from adapter.demo.stack import JOBS_DONE_KEY, JOBS_KEY, KAFKA_GROUP, KAFKA_PARTITIONS, KAFKA_TOPIC
from adapter.demo.timeline import Timeline
from adapter.demo.workloads import LocalWorkload

_POLL = 0.1


@dataclass(frozen=True)
class Plan:
    name: str
    idle: float  # seconds at zero before anything happens
    single_request: bool  # one lone request first: a cold start in its purest form
    burst_seconds: float
    burst_clients: int
    jobs: int
    kafka_messages: int
    # Wait for the app to return to zero before the jobs phase (the full story) or overlap them (smoke).
    sequential: bool
    settle: float  # longest wait for a workload to go up, or back to zero


PLANS = {
    "smoke": Plan("smoke", 2.0, False, 3.0, 30, 40, 100, False, 30.0),
    "full": Plan("full", 5.0, True, 8.0, 40, 150, 300, True, 60.0),
}


@dataclass
class Outcome:
    jobs_pushed: int = 0
    jobs_done: int = 0
    kafka_messages: int = 0
    kafka_consumed: int = 0  # the consumer group's committed offsets, summed
    timeouts: tuple[str, ...] = ()


class Scenario:
    def __init__(
        self,
        plan: Plan,
        timeline: Timeline,
        workloads: Mapping[str, LocalWorkload],
        proxy_port: int,
        redis_url: str,
        kafka_bootstrap: str | None,
    ) -> None:
        self.plan = plan
        self.timeline = timeline
        self.workloads = workloads
        self.proxy_port = proxy_port
        self.redis_url = redis_url
        self.kafka_bootstrap = kafka_bootstrap
        self.outcome = Outcome()

    def _web_cold(self) -> bool:
        return self.workloads["web"].ready_replicas == 0

    async def run(self) -> Outcome:
        import redis.asyncio as redis

        plan, timeline = self.plan, self.timeline
        client = redis.Redis.from_url(self.redis_url)
        try:
            timeline.phase("idle: everything at zero")
            await asyncio.sleep(plan.idle)
            if plan.single_request:
                timeline.phase("one request: held by the proxy while the app wakes")
                await request(self.proxy_port, timeline, self._web_cold, "/first")
                timeline.phase("HTTP idle: the app goes back to zero")
                await self._back_to_zero("web")
            timeline.phase(
                f"HTTP burst from zero: {plan.burst_clients} clients for {plan.burst_seconds:g}s (held), and a person "
                "opening the app in a browser (the waking page at once, the app when it reloads)"
            )
            await asyncio.gather(
                burst(self.proxy_port, timeline, self._web_cold, plan.burst_seconds, plan.burst_clients),
                browse(self.proxy_port, timeline),
            )
            if plan.sequential:
                timeline.phase("HTTP idle: the app goes back to zero")
                await self._back_to_zero("web")
            timeline.phase(f"{plan.jobs} jobs pushed to Redis")
            await client.rpush(JOBS_KEY, *(f"job-{n}" for n in range(plan.jobs)))
            self.outcome.jobs_pushed = plan.jobs
            await self._woken("worker")
            if self.kafka_bootstrap is not None:
                if plan.sequential:
                    timeline.phase("queue empty: the worker goes back to zero")
                    await self._back_to_zero("worker")
                timeline.phase(f"{plan.kafka_messages} messages to Kafka")
                await self._produce()
                await self._woken("consumer")
            timeline.phase("everything goes back to zero")
            await asyncio.gather(*(self._back_to_zero(name) for name in self.workloads))
            self.outcome.jobs_done = int(await client.get(JOBS_DONE_KEY) or 0)
            if self.kafka_bootstrap is not None:
                self.outcome.kafka_consumed = await self._committed()
        finally:
            await client.aclose()
        return self.outcome

    async def _produce(self) -> None:
        from aiokafka import AIOKafkaProducer

        assert self.kafka_bootstrap is not None
        producer = AIOKafkaProducer(bootstrap_servers=self.kafka_bootstrap)
        await producer.start()
        try:
            for n in range(self.plan.kafka_messages):
                await producer.send(KAFKA_TOPIC, f"event-{n}".encode(), partition=n % KAFKA_PARTITIONS)
            await producer.flush()
        finally:
            await producer.stop()
        self.outcome.kafka_messages = self.plan.kafka_messages

    async def _committed(self) -> int:
        from aiokafka.admin import AIOKafkaAdminClient

        admin = AIOKafkaAdminClient(bootstrap_servers=self.kafka_bootstrap)
        await admin.start()
        try:
            offsets = await admin.list_consumer_group_offsets(KAFKA_GROUP)
        finally:
            await admin.close()
        return sum(max(0, meta.offset) for meta in offsets.values())

    async def _woken(self, name: str) -> None:
        workload = self.workloads[name]
        await self._until(lambda: workload.spec_replicas > 0, f"{name} woken")

    async def _back_to_zero(self, name: str) -> None:
        workload = self.workloads[name]
        await self._until(lambda: workload.spec_replicas == 0 and workload.status_replicas == 0, f"{name} at zero")

    async def _until(self, condition: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + self.plan.settle
        while not condition():
            if time.monotonic() > deadline:
                self.outcome.timeouts += (f"{what} (not within {self.plan.settle:g}s)",)
                return
            await asyncio.sleep(_POLL)
