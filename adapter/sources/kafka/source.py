"""The `kafka` source: consumer-group lag (`consumer_lag`), read with aiokafka.

One source is one cluster connection shared by every metric naming it. A query names a group,
optionally topics and partitions; the offsets come from a GroupReader round shared with every
other series of the same group, and the lag rules are applied per metric (lag.py). A shared
read holds facts, not verdicts: each series finds in it the answer for its own topics and
partitions, and only its own errors, each naming the group and topics it is about.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from decimal import Decimal

from adapter.config.kafka import KafkaMetric, KafkaSource
from adapter.sources.base import Sample, Source, SourceError, SourceQuery
from adapter.sources.kafka.connection import KafkaConnection
from adapter.sources.kafka.export import ReadExport
from adapter.sources.kafka.groups import GroupOffsets, GroupReader, PartitionOffsets
from adapter.sources.kafka.lag import PersistentLag, group_lags, served_lag

_PARTITIONS = re.compile(r"^(\d+)(?:-(\d+))?$")

log = logging.getLogger(__name__)


class KafkaLag(Source):
    def __init__(self, config: KafkaSource) -> None:
        super().__init__()
        self.name = config.name
        self._conn = KafkaConnection(config)
        self._export = ReadExport(config.name, config.partition_lag_series_limit)
        self._groups = GroupReader(
            self._conn, config.metadata_max_age, config.offsets_max_age, self._export.read, self._export.forget
        )
        self._persistent = PersistentLag(config.persistent_lag_window)
        self._poll_interval = config.poll_interval
        self._watched: dict[str, set[SourceQuery]] = {}  # group -> the series kept warm that read it
        self._poller: asyncio.Task[None] | None = None

    async def query(self, query: SourceQuery) -> list[Sample]:
        metric = query.metric
        if not isinstance(metric, KafkaMetric):
            raise SourceError(f"metric {metric.name} is not a kafka metric")
        groups = query.params.get("group", ())
        if len(groups) != 1:
            raise SourceError(f"the selector must give exactly one group (e.g. group=my-consumers), not {groups}")
        group = groups[0]
        named = frozenset(query.params.get("topic", ()))
        about = f"group {group!r}, " + (f"topic {','.join(sorted(named))!r}" if named else "every committed topic")
        try:
            wanted = _partition_filter(query.params.get("partition"))
            offsets = await self._groups.read(group, named)
            topics = _topics(offsets, named)
            chosen = _select(offsets, topics, wanted, query.params.get("partition", ()))
        except SourceError as err:
            raise SourceError(f"{about}: {err}") from err
        lags = group_lags(metric, group, offsets.read, offsets.read_at, chosen, self._persistent)
        self._export.lag(metric.name, group, lags, query)
        return [
            Sample(
                Decimal(served_lag(lags, metric)),
                {"group": group, "topic": ",".join(topics)},
                read_at=offsets.read_wall,
            )
        ]

    # --- push: watched groups are read every poll_interval; a change wakes their series at once ---

    def watch(self, query: SourceQuery) -> None:
        groups = query.params.get("group", ())
        if len(groups) != 1:
            return  # a selector without one group is refused by query()
        self._watched.setdefault(groups[0], set()).add(query)
        if self._poller is None or self._poller.done():
            self._poller = asyncio.create_task(self._poll(), name=f"kafka poll {self.name}")

    def unwatch(self, query: SourceQuery) -> None:
        groups = query.params.get("group", ())
        watched = self._watched.get(groups[0]) if len(groups) == 1 else None
        if watched is None:
            return
        group = groups[0]
        watched.discard(query)
        self._export.forget_lag(query.metric.name, group, query)
        if not watched:
            del self._watched[group]
            self._groups.forget(group)

    async def _poll(self) -> None:
        """One round for every watched group per poll_interval (sleeping the rest of the interval)."""
        loop = asyncio.get_running_loop()
        previous: dict[str, GroupOffsets] = {}
        while self._watched:
            started = loop.time()
            wanted = {
                group: frozenset(t for q in queries for t in q.params.get("topic", ()))
                for group, queries in self._watched.items()
            }
            results = await asyncio.gather(
                *(self._groups.read_now(group, topics) for group, topics in wanted.items()), return_exceptions=True
            )
            for group, result in zip(wanted, results, strict=True):
                if isinstance(result, asyncio.CancelledError):
                    raise result
                if isinstance(result, BaseException):
                    # The series see the error on their own refresh, once the last read is too old.
                    if not isinstance(result, SourceError):
                        log.error("polling kafka group %r failed unexpectedly", group, exc_info=result)
                    continue
                if _same_facts(previous.get(group), result):
                    continue
                previous[group] = result
                for query in list(self._watched.get(group, ())):
                    # exclude_persistent_lag too: it compares commits persistent_lag_window apart, however
                    # often it is woken.
                    self.changed(query)
            for group in previous.keys() - self._watched.keys():
                del previous[group]
            await asyncio.sleep(max(0.0, self._poll_interval - (loop.time() - started)))
        self._poller = None

    async def check(self) -> None:
        await self._conn.client()  # bootstrapping reads the cluster's metadata

    async def close(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
        self._export.clear()
        await self._groups.close()
        await self._conn.close()


def _same_facts(before: GroupOffsets | None, after: GroupOffsets) -> bool:
    return before is not None and (before.topics, before.missing, before.unread) == (
        after.topics,
        after.missing,
        after.unread,
    )


def _topics(offsets: GroupOffsets, named: frozenset[str]) -> list[str]:
    """The topics a series reads: those it names, or every topic the group committed to; all must exist."""
    if not named and not offsets.committed_topics:
        raise SourceError(
            "the group has no committed offsets: it does not exist (deleted?) or never "
            "committed; to count the lag of a group that has not started yet, give its topic in the selector"
        )
    topics = sorted(named or offsets.committed_topics)
    for topic in topics:
        if topic in offsets.missing:
            if topic in named:
                raise SourceError(f"topic {topic!r} does not exist")
            raise SourceError(f"the group has offsets for topic {topic!r}, which no longer exists")
    return topics


def _select(
    offsets: GroupOffsets, topics: list[str], wanted: set[int] | None, given: tuple[str, ...]
) -> list[tuple[str, int, PartitionOffsets]]:
    unread = sorted(
        (tp, cause) for tp, cause in offsets.unread.items() if tp[0] in topics and (wanted is None or tp[1] in wanted)
    )
    if unread:
        (topic, partition), cause = unread[0]
        raise SourceError(f"reading the offsets of topic {topic!r} partition {partition}: {cause}")
    chosen = [
        (topic, partition, partition_offsets)
        for topic in topics
        for partition, partition_offsets in sorted(offsets.topics[topic].items())
        if wanted is None or partition in wanted
    ]
    if not chosen:
        listed = ", ".join(repr(t) for t in topics)
        raise SourceError(f"no partition of topic {listed} is among the selector's partitions ({','.join(given)})")
    return chosen


def _partition_filter(values: tuple[str, ...] | None) -> set[int] | None:
    """`partition in (0,3,10-19)` -> {0, 3, 10, ..., 19}; None when the selector gives no partition."""
    if values is None:
        return None
    chosen: set[int] = set()
    for value in values:
        match = _PARTITIONS.match(value)
        if match is None:
            raise SourceError(f"partition {value!r} is neither a number nor a range like 0-9")
        first = int(match.group(1))
        last = int(match.group(2) or first)
        if last < first or last - first > 100_000:
            raise SourceError(f"partition range {value!r} is empty or too large")
        chosen.update(range(first, last + 1))
    return chosen
