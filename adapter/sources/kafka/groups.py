"""Reading consumer groups' offsets in rounds, shared by every series that reads the same group.

A series asks for a group (and the topics its selector names). Every group asked for in the same
event-loop turn joins one round: one metadata read (itself shared for `metadata_max_age`), one
OffsetFetch per coordinator (v8; one per group on brokers without it), then two ListOffsets per
leader broker (log end and log start, sent together) for all the groups' partitions. A group's
result then serves every series for `offsets_max_age`.

Why the log start is read every round, costing a second ListOffsets per leader: a broker refuses the same
partition twice in one ListOffsets (INVALID_REQUEST), and no cheaper exact rule exists. The log start only
grows, so a commit below a start read earlier is below the current one too; but a commit at or above it
may be below the current start (retention may have run since), and that is exactly the lagging partition
whose value depends on it (end - commit if valid, the policy's value if not). Skipping the read would
serve a guess on every lagging partition. Fetch (v5+) answers both offsets in one request, but needs the
READ permission on the topic (reading the records), where ListOffsets needs only DESCRIBE; a lag reader
should not be able to read the data.

A round's result is a set of facts (offsets, missing topics, partitions that could not be read),
never one error for the whole group: a topic one series names and the cluster lacks is that series'
error, not the error of every series of the group.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from aiokafka.structs import TopicPartition
from opentelemetry.trace import Span

from adapter.sources.base import SourceError
from adapter.sources.kafka.connection import KafkaConnection
from adapter.sources.kafka.offsets import (
    EARLIEST,
    LATEST,
    ClusterMetadata,
    Committed,
    CommittedReader,
    Coordinators,
    MetadataReader,
    log_offsets,
)
from adapter.telemetry import kafka as telemetry
from adapter.telemetry import reads as spans
from adapter.telemetry import tracing

log = logging.getLogger(__name__)

NO_COMMIT = -1  # KEDA's invalidOffset: the group has no committed offset for the partition


_FORGET_AFTER = 600.0  # seconds


@dataclass(frozen=True)
class PartitionOffsets:
    committed: int  # NO_COMMIT when absent
    end: int  # log-end offset (high watermark)
    start: int  # log-start offset: below it retention (or DeleteRecords) removed the records


@dataclass(frozen=True)
class GroupOffsets:
    group: str
    read: int  # increases with every round: tells two reads apart for persistent-lag detection
    read_at: float  # monotonic
    read_wall: float  # wall-clock time the round started: every answer of the brokers is at least this new
    committed_topics: frozenset[str]
    asked: frozenset[str]  # every topic this read covers (committed or named), whether it exists or not
    topics: Mapping[str, Mapping[int, PartitionOffsets]]  # the asked topics that exist, without `unread`
    missing: frozenset[str]  # the asked topics the cluster does not have
    unread: Mapping[tuple[str, int], str]  # partitions whose offsets (committed or log) could not be read, and why


# Told of every group read, and of every group forgotten (nobody read it for _FORGET_AFTER).
ReadListener = Callable[[GroupOffsets], None]
ForgetListener = Callable[[str], None]


@dataclass
class _Round:
    wanted: dict[str, set[str]]  # group -> topics named by selectors
    results: dict[str, asyncio.Future[GroupOffsets]]
    callers: list[Span | None]  # the spans of the refreshes that asked for it (tracing on)
    span: Span | None = None  # once it runs (tracing on)

    def join(self, caller: Span | None) -> None:
        """One more refresh waits for this round (its span is the round's parent or links to it)."""
        if self.span is None:
            self.callers.append(caller)
        else:
            spans.joined(self.span, caller)


class GroupReader:
    def __init__(
        self,
        conn: KafkaConnection,
        metadata_max_age: float,
        offsets_max_age: float,
        on_read: ReadListener,
        on_forget: ForgetListener,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._conn = conn
        self._wall_clock = wall_clock
        self._on_read = on_read
        self._on_forget = on_forget
        self._metadata = MetadataReader(conn, metadata_max_age, clock)
        self._committed = CommittedReader(conn, Coordinators(conn))
        self._max_age = offsets_max_age
        self._clock = clock
        self._latest: dict[str, GroupOffsets] = {}
        self._in_flight: dict[str, tuple[frozenset[str], asyncio.Future[GroupOffsets], _Round]] = {}
        self._forgotten: set[str] = set()  # forgotten while a round read them: their result is not kept
        self._next: _Round | None = None
        self._reads = itertools.count(1)
        self._rounds: set[asyncio.Task[None]] = set()

    async def read(self, group: str, topics: frozenset[str]) -> GroupOffsets:
        """The group's offsets for its committed topics and `topics`, at most offsets_max_age old."""
        latest = self._latest.get(group)
        if latest is not None and self._clock() - latest.read_at < self._max_age and topics <= latest.asked:
            return latest
        return await self.read_now(group, topics)

    async def read_now(self, group: str, topics: frozenset[str]) -> GroupOffsets:
        """A new read of the group (joining one in flight that covers `topics`), whatever its age."""
        in_flight = self._in_flight.get(group)
        if in_flight is not None and topics <= in_flight[0]:
            if tracing.TRACER is not None:
                in_flight[2].join(spans.caller())
            return await asyncio.shield(in_flight[1])
        return await asyncio.shield(self._join(group, topics))

    def forget(self, group: str) -> None:
        """Nobody reads the group any more (also the round reading it now: its result serves its
        waiters but is neither kept nor told)."""
        if group in self._in_flight:
            self._forgotten.add(group)
        if self._latest.pop(group, None) is not None:
            self._on_forget(group)

    def _join(self, group: str, topics: frozenset[str]) -> asyncio.Future[GroupOffsets]:
        self._forgotten.discard(group)  # asked for again
        if self._next is None:
            self._next = _Round({}, {}, [])
            asyncio.get_running_loop().call_soon(self._start_round)
        if tracing.TRACER is not None:
            self._next.join(spans.caller())
        self._next.wanted.setdefault(group, set()).update(topics)
        future = self._next.results.get(group)
        if future is None:
            future = self._next.results[group] = asyncio.get_running_loop().create_future()
            future.add_done_callback(_consume_exception)
        self._in_flight[group] = (frozenset(self._next.wanted[group]), future, self._next)
        return future

    def _start_round(self) -> None:
        round_, self._next = self._next, None
        assert round_ is not None
        run = self._run(round_) if tracing.TRACER is None else self._traced_run(round_)
        task = asyncio.create_task(run, name="kafka offsets round")
        self._rounds.add(task)
        task.add_done_callback(self._rounds.discard)

    async def close(self) -> None:
        for task in self._rounds:
            task.cancel()
        await asyncio.gather(*self._rounds, return_exceptions=True)

    async def _traced_run(self, round_: _Round) -> None:
        """`_run` under the round's span, shared by its callers (adapter/telemetry/reads.py), current in its task for
        the steps' spans."""
        groups = sorted(round_.wanted)
        attributes: dict[str, str | int] = {
            tracing.MESSAGING_SYSTEM: "kafka",
            tracing.SOURCE: self._conn.source_name,
            tracing.KAFKA_GROUPS: len(groups),
        }
        if len(groups) == 1:
            attributes[tracing.MESSAGING_GROUP] = groups[0]
        span = round_.span = spans.start_shared(tracing.KAFKA_ROUND, round_.callers, attributes)
        assert span is not None
        try:
            with spans.current_in_task(span):
                await self._run(round_)
        finally:
            span.end()

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
            self.forget(group)
        for group, future in round_.results.items():
            in_flight = self._in_flight.get(group)
            if in_flight is not None and in_flight[1] is future:
                del self._in_flight[group]
            outcome = outcomes[group]
            if isinstance(outcome, GroupOffsets):
                if group in self._forgotten:
                    self._forgotten.discard(group)
                else:
                    self._latest[group] = outcome
                    self._on_read(outcome)
                future.set_result(outcome)
            else:
                if round_.span is not None:
                    spans.failed(round_.span, str(outcome))
                future.set_exception(outcome)

    async def _read_round(self, wanted: Mapping[str, set[str]], read: int) -> dict[str, GroupOffsets | SourceError]:
        wall = self._wall_clock()
        outcomes: dict[str, GroupOffsets | SourceError] = {}
        committed: dict[str, Committed] = {}
        with spans.step(tracing.KAFKA_OFFSET_FETCH):
            fetched = await self._committed.read(list(wanted))
        for group, result in fetched.items():
            if isinstance(result, SourceError):
                outcomes[group] = result
            else:
                committed[group] = result
        committed_topics = {group: offsets.topics() for group, offsets in committed.items()}
        asked = {group: topics | wanted[group] for group, topics in committed_topics.items()}
        with spans.step(tracing.KAFKA_METADATA):
            metadata = await self._metadata.leaders(set().union(*asked.values()))
            if unlisted := _unlisted(committed, metadata):
                # Partitions are only ever added (a recreated topic's commits are removed with it): a commit on a
                # partition the kept metadata lacks means the metadata is older than the partition. Ask again.
                self._metadata.invalidate({tp.topic for tps in unlisted.values() for tp in tps})
                metadata = await self._metadata.leaders(set().union(*asked.values()))
                unlisted = _unlisted(committed, metadata)
        partitions = {
            group: [TopicPartition(t, p) for t in sorted(names & metadata.leaders.keys()) for p in metadata.leaders[t]]
            for group, names in asked.items()
        }
        every = {tp for tps in partitions.values() for tp in tps}
        # The start is needed for every partition: a commit below it points at records retention removed.
        with spans.step(tracing.KAFKA_LIST_OFFSETS):
            ends, starts = await asyncio.gather(
                log_offsets(self._conn, metadata, every, LATEST),
                log_offsets(self._conn, metadata, every, EARLIEST),
            )
        if ends.errors or starts.errors:
            self._metadata.invalidate()  # most likely a leader moved
        now = self._clock()
        for group, tps in partitions.items():
            by_topic: dict[str, dict[int, PartitionOffsets]] = {t: {} for t in asked[group] if t in metadata.leaders}
            unread: dict[tuple[str, int], str] = {
                (tp.topic, tp.partition): f"the group committed to partition {tp.partition}, which the cluster's "
                f"metadata does not list (it lists {len(metadata.leaders[tp.topic])} partitions)"
                for tp in unlisted.get(group, ())
            }
            for tp in tps:
                cause = committed[group].errors.get(tp) or ends.errors.get(tp) or starts.errors.get(tp)
                if cause is not None:
                    unread[(tp.topic, tp.partition)] = cause
                    continue
                by_topic[tp.topic][tp.partition] = PartitionOffsets(
                    committed=committed[group].offsets.get(tp, NO_COMMIT),
                    end=ends.offsets[tp],
                    start=starts.offsets[tp],
                )
            outcomes[group] = GroupOffsets(
                group=group,
                read=read,
                read_at=now,
                read_wall=wall,
                committed_topics=frozenset(committed_topics[group]),
                asked=frozenset(asked[group]),
                topics=by_topic,
                missing=frozenset(asked[group] - metadata.leaders.keys()),
                unread=unread,
            )
        return outcomes


def _unlisted(committed: Mapping[str, Committed], metadata: ClusterMetadata) -> dict[str, list[TopicPartition]]:
    """Per group, its committed partitions of existing topics that the metadata does not list."""
    unlisted: dict[str, list[TopicPartition]] = {}
    for group, offsets in committed.items():
        for tp in [*offsets.offsets, *offsets.errors]:
            if tp.topic in metadata.leaders and tp.partition not in metadata.leaders[tp.topic]:
                unlisted.setdefault(group, []).append(tp)
    return unlisted


def _consume_exception(future: asyncio.Future[GroupOffsets]) -> None:
    # A round's failure is delivered to every waiter; with none left, do not log it as unretrieved.
    if not future.cancelled():
        future.exception()
