"""Per-partition lag on the Prometheus endpoint, with a cap on how many series one source exports."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

from prometheus_client import Gauge

from adapter.sources.kafka_lag import PartitionLag
from adapter.telemetry import kafka as telemetry


class PartitionLagExport:
    def __init__(self, source: str, limit: int) -> None:
        self._source = source
        self._limit = limit
        # (group, topic, partition) -> its gauge; kept, since looking a child up by labels is slow
        self._series: dict[tuple[str, str, int], Gauge] = {}

    def update(self, group: str, existing: Mapping[str, Collection[int]], lags: Iterable[PartitionLag]) -> None:
        """Set the group's lag per partition; drop its series of partitions that no longer exist
        on the topics read (`existing`: topic -> partitions, as just read)."""
        fresh = {(group, p.topic, p.partition): p.lag_with_persistent for p in lags}
        gone = [k for k in self._series if k[0] == group and k[1] in existing and k[2] not in existing[k[1]]]
        for key in gone:
            self._remove(key)
        for key, lag in fresh.items():
            gauge = self._series.get(key)
            if gauge is None:
                if len(self._series) >= self._limit:
                    telemetry.PARTITION_LAG_DROPPED.labels(self._source).inc()
                    continue
                gauge = self._series[key] = telemetry.PARTITION_LAG.labels(self._source, key[0], key[1], str(key[2]))
            gauge.set(lag)

    def _remove(self, key: tuple[str, str, int]) -> None:
        del self._series[key]
        group, topic, partition = key
        telemetry.PARTITION_LAG.remove(self._source, group, topic, str(partition))

    def clear(self) -> None:
        for key in list(self._series):
            self._remove(key)
