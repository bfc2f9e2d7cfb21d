"""The three reads lag needs, as low-level Kafka requests: cluster metadata, groups' committed
offsets (OffsetFetch: v8, every group of one coordinator in one request, where the broker has it;
else one request per group) and partitions' log offsets (ListOffsets, one request per leader broker).

aiokafka's admin client would open its own connections and ask once per group and partition set;
sending the requests through the source's one client keeps the count per refresh fixed.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from aiokafka.errors import for_code
from aiokafka.protocol.commit import OffsetFetchRequest
from aiokafka.protocol.coordination import FindCoordinatorRequest
from aiokafka.protocol.metadata import MetadataRequest
from aiokafka.protocol.offset import OffsetRequest
from aiokafka.structs import TopicPartition

from adapter.sources.base import SourceError
from adapter.sources.kafka.connection import KafkaConnection
from adapter.sources.kafka.protocol import ListOffsets, OffsetFetchGroups, VersionUnsupported

# ListOffsets timestamps with a special meaning.
LATEST = -1
EARLIEST = -2
_CONSUMER_REPLICA = -1
_READ_UNCOMMITTED = 0
_NO_LEADER = -1
# OffsetFetch answers that mean "ask the group's coordinator again" (after finding it anew), and "ask again
# shortly" (the coordinator is loading the group's offsets: after a broker start or a coordinator move).
_COORDINATOR_MOVED = {15, 16}  # COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR
_COORDINATOR_LOADING = 14  # COORDINATOR_LOAD_IN_PROGRESS
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

    def invalidate(self, topics: Collection[str] | None = None) -> None:
        """Leadership changed (a NOT_LEADER answer), or a group committed to a partition these topics'
        entries lack: the next read asks afresh (for `topics`, or every topic)."""
        if topics is None:
            self._topics.clear()
        for topic in topics or ():
            self._topics.pop(topic, None)

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


@dataclass(frozen=True)
class Committed:
    """A group's committed offsets (partitions without a commit are absent), and the partitions whose
    offset the coordinator answered with an error, and why: those fail only the series that select them."""

    offsets: dict[TopicPartition, int]
    errors: dict[TopicPartition, str]

    def topics(self) -> set[str]:
        return {tp.topic for tp in self.offsets} | {tp.topic for tp in self.errors}


class CommittedReader:
    """Every offset each group has committed, one OffsetFetch v8 per coordinator for all its groups.

    Brokers without v8 (before Kafka 3.0) are asked group by group; that is learnt once per broker.
    """

    def __init__(self, conn: KafkaConnection, coordinators: Coordinators) -> None:
        self._conn = conn
        self._coordinators = coordinators
        self._single: set[int] = set()  # brokers known to lack OffsetFetch v8

    async def read(
        self, groups: Collection[str], attempts: int = _COORDINATOR_ATTEMPTS
    ) -> dict[str, Committed | SourceError]:
        """Each group's offsets or why they could not be read; groups whose coordinator moved or is
        loading are asked again (`attempts` in all), where it went or after a pause."""
        nodes = await asyncio.gather(*(self._coordinators.of(group) for group in groups), return_exceptions=True)
        result: dict[str, Committed | SourceError] = {}
        by_node: dict[int, list[str]] = defaultdict(list)
        for group, node in zip(groups, nodes, strict=True):
            if isinstance(node, SourceError):
                result[group] = node
            elif isinstance(node, BaseException):
                raise node
            else:
                by_node[node].append(group)
        answers = await asyncio.gather(*(self._ask(node, names, attempts) for node, names in by_node.items()))
        for answer in answers:
            result |= answer
        return result

    async def _ask(self, node: int, groups: list[str], attempts: int) -> dict[str, Committed | SourceError]:
        if node not in self._single:
            try:
                response = await self._conn.send(node, OffsetFetchGroups(groups), "OffsetFetch")
            except VersionUnsupported:
                self._single.add(node)
            except SourceError as err:
                for group in groups:
                    self._coordinators.forget(group)
                return dict.fromkeys(groups, err)
            else:
                return await self._answers(groups, response, attempts)
        one_by_one = await asyncio.gather(*(self._one(group) for group in groups), return_exceptions=True)
        return {group: _source_error(answer) for group, answer in zip(groups, one_by_one, strict=True)}

    async def _answers(self, groups: list[str], response: Any, attempts: int) -> dict[str, Committed | SourceError]:
        result: dict[str, Committed | SourceError] = {}
        again: list[str] = []
        loading = False
        asked = set(groups)
        for group, topics, error, _tags in response.groups:
            if group not in asked:
                continue  # not ours to read (a broken answer): the group asked for is missing, said below
            if error != 0:
                self._conn.counted_error("OffsetFetch")
            if error in _COORDINATOR_MOVED and attempts > 1:
                self._coordinators.forget(group)
                again.append(group)
            elif error == _COORDINATOR_LOADING and attempts > 1:
                loading = True
                again.append(group)
            elif error != 0:
                self._coordinators.forget(group)
                result[group] = SourceError(f"OffsetFetch answered {for_code(error).__name__}")
            else:
                entries = ((topic, [(p[0], p[1], p[4]) for p in partitions]) for topic, partitions, _ in topics)
                result[group] = _committed(self._conn, entries)
        for group in groups:
            if group not in result and group not in again:
                result[group] = SourceError("the broker's OffsetFetch answer left the group out")
        if again:
            if loading:
                await asyncio.sleep(_COORDINATOR_BACKOFF)
            result |= await self.read(again, attempts - 1)
        return result

    async def _one(self, group: str) -> Committed:
        """One group's offsets (OffsetFetch v1-v3); asked again if the coordinator moved or is loading."""
        for attempt in range(1, _COORDINATOR_ATTEMPTS + 1):
            node = await self._coordinators.of(group)
            try:
                response = await self._conn.send(node, OffsetFetchRequest(group, None), "OffsetFetch")
            except SourceError:
                self._coordinators.forget(group)
                raise
            error = getattr(response, "error_code", 0)
            if error in (*_COORDINATOR_MOVED, _COORDINATOR_LOADING) and attempt < _COORDINATOR_ATTEMPTS:
                self._conn.counted_error("OffsetFetch")
                if error == _COORDINATOR_LOADING:
                    await asyncio.sleep(_COORDINATOR_BACKOFF)
                else:
                    self._coordinators.forget(group)
                continue
            if error != 0:
                self._conn.counted_error("OffsetFetch")
                self._coordinators.forget(group)
                raise SourceError(f"OffsetFetch answered {for_code(error).__name__}")
            break
        entries = ((topic, [(p[0], p[1], p[3]) for p in partitions]) for topic, partitions in response.topics)
        return _committed(self._conn, entries)


def _committed(conn: KafkaConnection, topics: Iterable[tuple[str, list[tuple[int, int, int]]]]) -> Committed:
    """(topic, [(partition, offset, error)]) -> the committed offsets (-1 means no commit) and errors."""
    committed = Committed({}, {})
    for topic, partitions in topics:
        for partition, offset, error in partitions:
            tp = TopicPartition(topic, partition)
            if error != 0:
                conn.counted_error("OffsetFetch")
                committed.errors[tp] = f"OffsetFetch answered {for_code(error).__name__}"
            elif offset >= 0:
                committed.offsets[tp] = offset
    return committed


def _source_error(answer: Committed | BaseException) -> Committed | SourceError:
    if isinstance(answer, SourceError) or not isinstance(answer, BaseException):
        return answer
    raise answer


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
        fields = (_CONSUMER_REPLICA, _READ_UNCOMMITTED, list(topics.items()))
        try:
            try:
                response = await conn.send(leader, ListOffsets(*fields), "ListOffsets")
            except VersionUnsupported:  # a broker older than Kafka 2.0: aiokafka's own, v1 or v2
                response = await conn.send(leader, OffsetRequest(*fields), "ListOffsets")
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
