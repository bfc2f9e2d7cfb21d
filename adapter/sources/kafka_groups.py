"""Reading consumer groups' offsets in rounds, shared by every series that reads the same group.

A series asks for a group (and the topics its selector names). Every group asked for in the same
event-loop turn joins one round: one metadata read (itself shared for `metadata_max_age`), one
OffsetFetch per group, then one ListOffsets per leader broker for all the groups' partitions
together. A group's result then serves every series for `offsets_max_age`.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from aiokafka.structs import TopicPartition

from adapter.sources.base import SourceError
from adapter.sources.kafka_connection import KafkaConnection
from adapter.sources.kafka_offsets import (
    EARLIEST,
    LATEST,
    ClusterMetadata,
    Coordinators,
    MetadataReader,
    committed_offsets,
    log_offsets,
)
from adapter.telemetry import kafka as telemetry

log = logging.getLogger(__name__)

NO_COMMIT = -1  # KEDA's invalidOffset: the group has no committed offset for the partition


_FORGET_AFTER = 600.0  # seconds


@dataclass(frozen=True)
class PartitionOffsets:
    committed: int  # NO_COMMIT when absent
    end: int  # log-end offset (high watermark)
    start: int | None  # log-start offset, read only where the commit is absent or beyond the end


@dataclass(frozen=True)
class GroupOffsets:
    group: str
    read: int  # increases with every round: tells two reads apart for persistent-lag detection
    read_at: float  # monotonic
    committed_topics: frozenset[str]
    topics: Mapping[str, Mapping[int, PartitionOffsets]]


@dataclass
class _Round:
    wanted: dict[str, set[str]]  # group -> topics named by selectors
    results: dict[str, asyncio.Future[GroupOffsets]]


class GroupReader:
    def __init__(
        self,
        conn: KafkaConnection,
        metadata_max_age: float,
        offsets_max_age: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._conn = conn
        self._metadata = MetadataReader(conn, metadata_max_age, clock)
        self._coordinators = Coordinators(conn)
        self._max_age = offsets_max_age
        self._clock = clock
        self._latest: dict[str, GroupOffsets] = {}
        self._in_flight: dict[str, tuple[frozenset[str], asyncio.Future[GroupOffsets]]] = {}
        self._next: _Round | None = None
        self._reads = itertools.count(1)
        self._rounds: set[asyncio.Task[None]] = set()

    async def read(self, group: str, topics: frozenset[str]) -> GroupOffsets:
        """The group's offsets for its committed topics and `topics`, at most offsets_max_age old."""
        latest = self._latest.get(group)
        if latest is not None and self._clock() - latest.read_at < self._max_age and topics <= latest.topics.keys():
            return latest
        in_flight = self._in_flight.get(group)
        if in_flight is not None and topics <= in_flight[0]:
            return await asyncio.shield(in_flight[1])
        return await asyncio.shield(self._join(group, topics))

    def _join(self, group: str, topics: frozenset[str]) -> asyncio.Future[GroupOffsets]:
        if self._next is None:
            self._next = _Round({}, {})
            asyncio.get_running_loop().call_soon(self._start_round)
        self._next.wanted.setdefault(group, set()).update(topics)
        future = self._next.results.get(group)
        if future is None:
            future = self._next.results[group] = asyncio.get_running_loop().create_future()
            future.add_done_callback(_consume_exception)
        self._in_flight[group] = (frozenset(self._next.wanted[group]), future)
        return future

    def _start_round(self) -> None:
        round_, self._next = self._next, None
        assert round_ is not None
        task = asyncio.create_task(self._run(round_), name="kafka offsets round")
        self._rounds.add(task)
        task.add_done_callback(self._rounds.discard)

    async def close(self) -> None:
        for task in self._rounds:
            task.cancel()
        await asyncio.gather(*self._rounds, return_exceptions=True)

    async def _run(self, round_: _Round) -> None:
        started = self._clock()
        outcomes: dict[str, GroupOffsets | SourceError]
        try:
            outcomes = await self._read_round(round_.wanted, next(self._reads))
        except SourceError as err:
            outcomes = dict.fromkeys(round_.wanted, err)
        except Exception as err:  # a bug: every waiter gets an error, never a value
            log.exception("reading kafka offsets failed unexpectedly")
            outcomes = dict.fromkeys(round_.wanted, SourceError(f"internal error {type(err).__name__}: {err}"))
        except asyncio.CancelledError:  # the source is closing: nobody waits forever
            for future in round_.results.values():
                future.cancel()
            raise
        finally:
            telemetry.GROUP_READ_SECONDS.labels(self._conn.source_name).observe(self._clock() - started)
        # Groups nobody has read for a while are forgotten, so the map stays as small as the series.
        for group in [g for g, offsets in self._latest.items() if started - offsets.read_at > _FORGET_AFTER]:
            del self._latest[group]
        for group, future in round_.results.items():
            if self._in_flight.get(group, (None, None))[1] is future:
                del self._in_flight[group]
            outcome = outcomes[group]
            if isinstance(outcome, GroupOffsets):
                self._latest[group] = outcome
                future.set_result(outcome)
            else:
                future.set_exception(outcome)

    async def _read_round(self, wanted: Mapping[str, set[str]], read: int) -> dict[str, GroupOffsets | SourceError]:
        committed_list = await asyncio.gather(
            *(committed_offsets(self._conn, self._coordinators, group) for group in wanted), return_exceptions=True
        )
        outcomes: dict[str, GroupOffsets | SourceError] = {}
        committed: dict[str, dict[TopicPartition, int]] = {}
        for group, result in zip(wanted, committed_list, strict=True):
            if isinstance(result, SourceError):
                outcomes[group] = result
            elif isinstance(result, BaseException):
                raise result
            else:
                committed[group] = result
        topics = {group: {tp.topic for tp in offsets} | wanted[group] for group, offsets in committed.items()}
        metadata = await self._metadata.leaders(set().union(*topics.values()))
        partitions: dict[str, list[TopicPartition]] = {}
        for group, names in topics.items():
            problem = _missing(group, names, wanted[group], metadata)
            if problem is not None:
                outcomes[group] = problem
                continue
            partitions[group] = [TopicPartition(t, p) for t in sorted(names) for p in sorted(metadata.leaders[t])]
        every = {tp for tps in partitions.values() for tp in tps}
        no_commit = {tp for group, tps in partitions.items() for tp in tps if tp not in committed[group]}
        ends, starts = await asyncio.gather(
            log_offsets(self._conn, metadata, every, LATEST),
            log_offsets(self._conn, metadata, no_commit, EARLIEST),
        )
        # A commit beyond the log end (topic recreated, log truncated) is invalid too; its reset needs the start.
        beyond = {
            tp
            for group, tps in partitions.items()
            for tp in tps
            if tp in ends.offsets and committed[group].get(tp, NO_COMMIT) > ends.offsets[tp]
        }
        if beyond:
            more = await log_offsets(self._conn, metadata, beyond, EARLIEST)
            starts.offsets.update(more.offsets)
            starts.errors.update(more.errors)
        if ends.errors or starts.errors:
            self._metadata.invalidate()  # most likely a leader moved
        now = self._clock()
        for group, tps in partitions.items():
            failed = next((tp for tp in tps if tp in ends.errors or tp in starts.errors), None)
            if failed is not None:
                cause = ends.errors.get(failed) or starts.errors[failed]
                outcomes[group] = SourceError(f"reading the log offsets of {failed.topic}-{failed.partition}: {cause}")
                continue
            by_topic: dict[str, dict[int, PartitionOffsets]] = {}
            for tp in tps:
                by_topic.setdefault(tp.topic, {})[tp.partition] = PartitionOffsets(
                    committed=committed[group].get(tp, NO_COMMIT),
                    end=ends.offsets[tp],
                    start=starts.offsets.get(tp),
                )
            outcomes[group] = GroupOffsets(
                group=group,
                read=read,
                read_at=now,
                committed_topics=frozenset(tp.topic for tp in committed[group]),
                topics=by_topic,
            )
        return outcomes


def _missing(
    group: str,
    topics: set[str],
    named: set[str],
    metadata: ClusterMetadata,
) -> SourceError | None:
    """Why a group cannot be read, never a silent zero: a topic or the whole group is gone."""
    if not topics:
        return SourceError(
            f"group {group!r} has no committed offsets: it does not exist (deleted?) or never committed; "
            "to count the lag of a group that has not started yet, give its topic in the selector"
        )
    for topic in sorted(topics):
        if topic not in metadata.leaders:
            if topic in named:
                return SourceError(f"topic {topic!r} does not exist")
            return SourceError(f"group {group!r} has offsets for topic {topic!r}, which no longer exists")
    return None


def _consume_exception(future: asyncio.Future[GroupOffsets]) -> None:
    # A round's failure is delivered to every waiter; with none left, do not log it as unretrieved.
    if not future.cancelled():
        future.exception()
