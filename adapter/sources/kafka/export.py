"""What the `kafka` source read, on the Prometheus endpoint.

The brokers' facts are exported once per partition, whichever metrics read them: the committed
offset per group, the log start and end per topic partition, and per group the partitions whose
commit is invalid. The lag as a metric counts it depends on that metric's policy, so it is labelled
by metric: two metrics on one group never write into the same series. Series of a topic or group
that is gone or no longer read are removed. At most `partition_lag_series_limit` series per source.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Iterable, Mapping

from prometheus_client import Gauge

from adapter.sources.kafka.groups import NO_COMMIT, GroupOffsets, PartitionOffsets
from adapter.sources.kafka.lag import INVALID_REASONS, PartitionLag, invalid_reason
from adapter.telemetry import kafka as telemetry

# A series: its family and its label values after `source`.
_Key = tuple[Gauge, tuple[str, ...]]


class ReadExport:
    def __init__(self, source: str, limit: int) -> None:
        self._source = source
        self._limit = limit
        # Kept, since looking a child up by labels is slow; with the value last set, since a partition's
        # facts are the same for every group reading its topic and mostly the same from one read to the next.
        self._children: dict[_Key, tuple[Gauge, float]] = {}
        self._dropped = telemetry.PARTITION_LAG_DROPPED.labels(source)
        self._groups: dict[str, set[_Key]] = {}  # group -> its series (committed, invalid, lag)
        self._logs: dict[tuple[str, int], set[str]] = {}  # topic partition -> groups whose read holds it
        self._held: dict[str, set[tuple[str, int]]] = {}  # group -> the partitions its last read holds
        self._last: dict[str, Mapping[str, Mapping[int, PartitionOffsets]]] = {}  # group -> its last facts
        # A metric's lag series -> the series (queries) that set it: it stays while one of them is read.
        self._lag_readers: dict[_Key, set[Hashable]] = {}

    def read(self, offsets: GroupOffsets) -> None:
        """A group was read: set its facts, drop its series of partitions no longer in the read."""
        group = offsets.group
        if self._last.get(group) == offsets.topics:
            return  # most reads of most groups change nothing: their series are already set
        self._last[group] = offsets.topics
        keep: set[_Key] = set()
        held = {(topic, p) for topic, partitions in offsets.topics.items() for p in partitions}
        invalid: Counter[str] = Counter()
        for topic, partitions in offsets.topics.items():
            for partition, facts in partitions.items():
                where = (topic, str(partition))
                if facts.committed != NO_COMMIT:
                    keep.add(self._set(telemetry.COMMITTED_OFFSET, (group, *where), facts.committed))
                self._set(telemetry.LOG_START_OFFSET, where, facts.start)
                self._set(telemetry.LOG_END_OFFSET, where, facts.end)
                self._logs.setdefault((topic, partition), set()).add(group)
                if (reason := invalid_reason(facts)) is not None:
                    invalid[reason] += 1
        for reason in INVALID_REASONS:
            keep.add(self._set(telemetry.INVALID_OFFSETS, (group, reason), invalid[reason]))
        owned = self._groups.setdefault(group, set())
        for key in list(owned):
            family, labels = key
            if key in keep or (family is telemetry.PARTITION_LAG and (labels[2], int(labels[3])) in held):
                continue
            owned.discard(key)
            self._remove(key)
        owned.update(key for key in keep if key in self._children)
        self._release(group, self._held.get(group, set()) - held)
        self._held[group] = held

    def lag(self, metric: str, group: str, lags: Iterable[PartitionLag], reader: Hashable) -> None:
        """A metric's lag per partition of a group (before persistent-lag exclusion) as series `reader`
        computed it, for the partitions whose facts are exported: a group forgotten while a series
        computed its lag gets none."""
        held = self._held.get(group)
        if not held:
            return
        owned = self._groups.setdefault(group, set())
        for p in lags:
            if (p.topic, p.partition) not in held:
                continue
            key = self._set(telemetry.PARTITION_LAG, (metric, group, p.topic, str(p.partition)), p.lag_with_persistent)
            if key in self._children:
                owned.add(key)
                self._lag_readers.setdefault(key, set()).add(reader)

    def forget_lag(self, metric: str, group: str, reader: Hashable) -> None:
        """Series `reader` of `metric` no longer reads the group: the metric's lag series of partitions
        no other series of the metric reads go (another series may select other topics or partitions)."""
        owned = self._groups.get(group, set())
        for key in [k for k in owned if k[0] is telemetry.PARTITION_LAG and k[1][0] == metric]:
            readers = self._lag_readers.get(key, set())
            readers.discard(reader)
            if not readers:
                owned.discard(key)
                self._remove(key)

    def forget(self, group: str) -> None:
        """Nobody reads the group any more."""
        for key in self._groups.pop(group, set()):
            self._remove(key)
        self._last.pop(group, None)
        self._release(group, self._held.pop(group, set()))

    def clear(self) -> None:
        for group in list(self._groups):
            self.forget(group)

    def _release(self, group: str, partitions: Iterable[tuple[str, int]]) -> None:
        """The group's read no longer holds these partitions: their log offsets go with the last reader."""
        for tp in partitions:
            readers = self._logs[tp]
            readers.discard(group)
            if not readers:
                del self._logs[tp]
                where = (tp[0], str(tp[1]))
                self._remove((telemetry.LOG_START_OFFSET, where))
                self._remove((telemetry.LOG_END_OFFSET, where))

    def _set(self, family: Gauge, labels: tuple[str, ...], value: float) -> _Key:
        key = (family, labels)
        known = self._children.get(key)
        if known is None:
            if len(self._children) >= self._limit:
                self._dropped.inc()
                return key
            child = family.labels(self._source, *labels)
        elif known[1] == value:
            return key
        else:
            child = known[0]
        child.set(value)
        self._children[key] = (child, value)
        return key

    def _remove(self, key: _Key) -> None:
        self._lag_readers.pop(key, None)
        if self._children.pop(key, None) is not None:
            family, labels = key
            family.remove(self._source, *labels)
