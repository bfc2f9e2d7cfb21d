"""The three reads lag needs, as low-level Kafka requests: cluster metadata, a group's committed
offsets (OffsetFetch) and partitions' log offsets (ListOffsets, one request per leader broker).

aiokafka's admin client would open its own connections and ask once per group and partition set;
sending the requests through the source's one client keeps the count per refresh fixed.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

from aiokafka.errors import for_code
from aiokafka.protocol.commit import OffsetFetchRequest
from aiokafka.protocol.coordination import FindCoordinatorRequest
from aiokafka.protocol.metadata import MetadataRequest
from aiokafka.protocol.offset import OffsetRequest
from aiokafka.structs import TopicPartition

from adapter.sources.base import SourceError
from adapter.sources.kafka_connection import KafkaConnection

# ListOffsets timestamps with a special meaning.
LATEST = -1
EARLIEST = -2
_CONSUMER_REPLICA = -1
_READ_UNCOMMITTED = 0
_NO_LEADER = -1
# OffsetFetch answers that mean "ask the group's coordinator again".
_COORDINATOR_MOVED = {15, 16}  # COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR
_GROUP_COORDINATOR = 0
_COORDINATOR_BUSY = {14, 15}  # COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE
_COORDINATOR_ATTEMPTS = 5
_COORDINATOR_BACKOFF = 0.2  # seconds


@dataclass(frozen=True)
class ClusterMetadata:
    """Topic -> partition -> leader broker id (-1 when the partition has no leader).

    Holds the topics asked for that exist; a topic that does not is absent.
    """

    leaders: Mapping[str, Mapping[int, int]]


class MetadataReader:
    """Partition leaders per topic; a topic's entry serves every group for `max_age` seconds.

    Only the topics the groups read are asked for, in one request per round, so a cluster's
    other topics cost nothing.
    """

    def __init__(self, conn: KafkaConnection, max_age: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._conn = conn
        self._max_age = max_age
        self._clock = clock
        self._topics: dict[str, tuple[float, dict[int, int]]] = {}  # topic -> (read at, leaders)

    def invalidate(self) -> None:
        """Leadership changed (a NOT_LEADER answer): the next read asks afresh."""
        self._topics.clear()

    async def leaders(self, topics: Collection[str]) -> ClusterMetadata:
        now = self._clock()
        stale = sorted(t for t in topics if (e := self._topics.get(t)) is None or now - e[0] >= self._max_age)
        if stale:
            await self._read(stale, now)
        return ClusterMetadata({t: self._topics[t][1] for t in topics if t in self._topics})

    async def _read(self, topics: list[str], now: float) -> None:
        client = await self._conn.client()
        response = await self._conn.send(self._conn.any_broker(), MetadataRequest(topics), "Metadata")
        # Keep aiokafka's own view (broker addresses, used to connect) as new as ours.
        client.cluster.update_metadata(response)
        for entry in response.topics:
            # v0: (error, topic, partitions); v1+: (error, topic, is_internal, partitions)
            error, topic, partitions = entry[0], entry[1], entry[-1]
            if error != 0:
                self._topics.pop(topic, None)  # UNKNOWN_TOPIC_OR_PARTITION: deleted or never created
                continue
            # Each partition: (error, partition, leader, replicas, isr, ...)
            self._topics[topic] = (now, {p[1]: p[2] for p in partitions})


class Coordinators:
    """Which broker coordinates each group, looked up once and kept until it moves."""

    def __init__(self, conn: KafkaConnection) -> None:
        self._conn = conn
        self._known: dict[str, int] = {}

    async def of(self, group: str) -> int:
        node = self._known.get(group)
        if node is None:
            node = self._known[group] = await self._find(group)
        return node

    async def _find(self, group: str) -> int:
        await self._conn.client()
        request = FindCoordinatorRequest(group, _GROUP_COORDINATOR)
        for attempt in range(_COORDINATOR_ATTEMPTS):
            response = await self._conn.send(self._conn.any_broker(), request, "FindCoordinator")
            if response.error_code == 0:
                return int(response.coordinator_id)
            self._conn.counted_error("FindCoordinator")
            # Not available yet: the offsets topic is being created, or its leader is moving.
            if response.error_code not in _COORDINATOR_BUSY or attempt == _COORDINATOR_ATTEMPTS - 1:
                break
            await asyncio.sleep(_COORDINATOR_BACKOFF)
        raise SourceError(f"no coordinator for the group: {for_code(response.error_code).__name__}")

    def forget(self, group: str) -> None:
        self._known.pop(group, None)


async def committed_offsets(conn: KafkaConnection, coordinators: Coordinators, group: str) -> dict[TopicPartition, int]:
    """Every offset the group has committed (OffsetFetch with no topic list); retries once if the
    coordinator moved. Partitions without a commit are absent."""
    for attempt in (1, 2):
        node = await coordinators.of(group)
        try:
            response = await conn.send(node, OffsetFetchRequest(group, None), "OffsetFetch")
        except SourceError:
            coordinators.forget(group)
            raise
        error = getattr(response, "error_code", 0)
        if error in _COORDINATOR_MOVED and attempt == 1:
            conn.counted_error("OffsetFetch")
            coordinators.forget(group)
            continue
        if error != 0:
            conn.counted_error("OffsetFetch")
            coordinators.forget(group)
            raise SourceError(f"OffsetFetch answered {for_code(error).__name__}")
        break
    offsets: dict[TopicPartition, int] = {}
    for topic, partitions in response.topics:
        for partition, offset, _metadata, error in partitions:
            if error != 0:
                conn.counted_error("OffsetFetch")
                raise SourceError(f"OffsetFetch answered {for_code(error).__name__} for {topic}-{partition}")
            if offset >= 0:
                offsets[TopicPartition(topic, partition)] = offset
    return offsets


@dataclass
class LogOffsets:
    """Offsets per partition, and why the partitions missing from `offsets` could not be read."""

    offsets: dict[TopicPartition, int]
    errors: dict[TopicPartition, str]


async def log_offsets(
    conn: KafkaConnection, metadata: ClusterMetadata, partitions: Collection[TopicPartition], timestamp: int
) -> LogOffsets:
    """Log-end (LATEST) or log-start (EARLIEST) offsets: one ListOffsets per leader, all at once."""
    result = LogOffsets({}, {})
    by_leader: dict[int, dict[str, list[tuple[int, int]]]] = defaultdict(lambda: defaultdict(list))
    for tp in partitions:
        leader = metadata.leaders.get(tp.topic, {}).get(tp.partition, _NO_LEADER)
        if leader == _NO_LEADER:
            result.errors[tp] = "the partition has no leader"
        else:
            by_leader[leader][tp.topic].append((tp.partition, timestamp))

    async def ask(leader: int, topics: dict[str, list[tuple[int, int]]]) -> None:
        request = OffsetRequest(_CONSUMER_REPLICA, _READ_UNCOMMITTED, list(topics.items()))
        try:
            response = await conn.send(leader, request, "ListOffsets")
        except SourceError as err:
            for topic, entries in topics.items():
                for partition, _ in entries:
                    result.errors[TopicPartition(topic, partition)] = str(err)
            return
        for topic, answers in response.topics:
            for answer in answers:
                # v1+: (partition, error_code, timestamp, offset[, leader_epoch])
                partition, error, offset = answer[0], answer[1], answer[3]
                tp = TopicPartition(topic, partition)
                if error != 0:
                    conn.counted_error("ListOffsets")
                    result.errors[tp] = f"ListOffsets answered {for_code(error).__name__}"
                else:
                    result.offsets[tp] = offset

    await asyncio.gather(*(ask(leader, topics) for leader, topics in by_leader.items()))
    for tp in partitions:
        if tp not in result.offsets and tp not in result.errors:
            result.errors[tp] = "the broker's ListOffsets answer left the partition out"
    return result
