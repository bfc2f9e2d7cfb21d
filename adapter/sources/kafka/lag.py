"""Consumer lag from offsets: KEDA's rules (docs/protocols.md#kafka-lag) with its known mistakes fixed.

Pure functions and one small piece of state (the commits seen at recent reads, for
`exclude_persistent_lag`), so every rule can be tested without a broker.

Where this differs from KEDA, on purpose:
- An invalid offset (no commit, a commit below the log start: its records were removed by retention,
  or a commit beyond the log end) is handled the same way under both policies: the consumer would
  restart at the log start (`earliest`: lag = end - start, so messages removed by retention are not
  lag) or at the log end (`latest`: lag 1, which lets one consumer start and commit). KEDA counted a
  commit below the log start as end - commit, records that no longer exist.
  `scale_to_zero_on_invalid_offset` makes either 0. It then goes through persistent-lag detection
  like any other offset (KEDA returned early and skipped it).
- A partition missing from the log-offset answer is an error upstream, never a lag of 0.
- `ensure_even_distribution_of_partitions` leaves a total of 0 at 0 (KEDA rounded it up to one
  consumer's worth, so a group with nothing to do never scaled to zero).
- Activity (KEDA's IsActive on lag including persistent lag) is carried by the value: see served_lag.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from adapter.config.kafka import KafkaMetric
from adapter.sources.kafka.groups import NO_COMMIT, PartitionOffsets


@dataclass(frozen=True)
class PartitionLag:
    topic: str
    partition: int
    lag: int  # what counts towards the metric
    lag_with_persistent: int  # the same before persistent-lag exclusion (KEDA's activity input)


INVALID_REASONS = ("no_commit", "below_log_start", "beyond_log_end")


def invalid_reason(offsets: PartitionOffsets) -> str | None:
    """Why the consumer would reset its position (None: the commit is valid); the metric's label."""
    if offsets.committed == NO_COMMIT:
        return "no_commit"
    if offsets.committed < offsets.start:
        return "below_log_start"
    if offsets.committed > offsets.end:
        return "beyond_log_end"
    return None


def partition_lag(offsets: PartitionOffsets, metric: KafkaMetric) -> int:
    """Lag of one partition before persistent-lag exclusion."""
    if invalid_reason(offsets) is None:
        return offsets.end - offsets.committed
    if metric.scale_to_zero_on_invalid_offset:
        return 0
    if metric.offset_reset_policy == "latest":
        return 1
    return offsets.end - offsets.start


def total_lag(lags: Iterable[PartitionLag], metric: KafkaMetric) -> tuple[int, int]:
    """(value served, total with persistent lag): KEDA's getTotalLag with its consumer cap."""
    lags = list(lags)
    total = sum(p.lag for p in lags)
    with_persistent = sum(p.lag_with_persistent for p in lags)
    if metric.allow_idle_consumers and not (
        metric.limit_to_partitions_with_lag or metric.ensure_even_distribution_of_partitions
    ):
        return total, with_persistent
    partitions = len(lags)
    upper_bound = sum(1 for p in lags if p.lag > 0) if metric.limit_to_partitions_with_lag else partitions
    threshold = metric.lag_threshold
    if metric.ensure_even_distribution_of_partitions and total > 0:
        total = _smallest_factor_reaching(partitions, total, threshold) * threshold
    if total // threshold > upper_bound:
        total = upper_bound * threshold
    return total, with_persistent


def served_lag(lags: Iterable[PartitionLag], metric: KafkaMetric) -> int:
    """The value served: the total lag, raised to one consumer's worth while the lag counting
    persistent lag is above `activation_lag_threshold`.

    KEDA keeps such a workload active (at least one replica) through IsActive; the value is the only
    signal the HPA gets here. Without the floor a group scaled to zero has nobody committing, all its
    lag looks persistent, and it would never wake. The floor is the activation point, or the lag
    threshold if lower, so it asks for one replica and no more.
    """
    total, with_persistent = total_lag(lags, metric)
    if with_persistent > metric.activation_lag_threshold:
        return max(total, min(metric.activation_lag_threshold + 1, metric.lag_threshold))
    return total


def _smallest_factor_reaching(partitions: int, total: int, threshold: int) -> int:
    """The fewest consumers that divide the partitions evenly and can take `total` at `threshold` each."""
    for factor in range(1, partitions + 1):
        if partitions % factor == 0 and factor * threshold >= total:
            return factor
    return partitions


_SLOTS = 32  # reads kept per persistent_lag_window and partition, at most (plus three: the ends)


class PersistentLag:
    """For `exclude_persistent_lag`: whether a partition's commit moved over the last `window` seconds.

    A series compares the commit of the read it evaluates with the commit at the newest earlier read
    made at least `window` before it: how often it is evaluated (every interval, or at each change the
    poller finds) does not change the answer, so a consumer that commits every few seconds is not taken
    for a stuck one when a produce wakes its series 0.8 s after the last read. With `window` 0 it is
    the read before. Several series may evaluate the same read; they all get the same answer.
    """

    _FORGET_AFTER = 600.0  # seconds without a look: the series is gone

    def __init__(self, window: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._window = window
        self._clock = clock
        # (metric, group, topic, partition) -> ([(read id, read at, commit)] oldest first, last look). Holds the
        # reads within the window, at least window/_SLOTS apart (so however often the group is read), and the
        # newest one before the window: the read compared with is window to window * (1 + 2/_SLOTS) older.
        self._seen: dict[tuple[str, str, str, int], tuple[list[tuple[int, float, int]], float]] = {}
        self._swept = clock()

    def previous(self, key: tuple[str, str, str, int], read: int, read_at: float, committed: int) -> int | None:
        """The commit at the newest read at least `window` before this one (read at `read_at`), or None
        when there is none yet (first sight)."""
        now = self._clock()
        self._sweep(now)
        history = self._seen[key][0] if key in self._seen else []
        if not history or read > history[-1][0]:
            if len(history) >= 2 and read_at - history[-2][1] < self._window / _SLOTS:
                history[-1] = (read, read_at, committed)  # close to the one before: keep the newer only
            else:
                history.append((read, read_at, committed))
        before = [i for i, (seen, at, _) in enumerate(history) if seen < read and at <= read_at - self._window]
        if before:
            del history[: before[-1]]  # older reads than the newest one before the window are not needed
        self._seen[key] = (history, now)
        return history[0][2] if before else None

    def _sweep(self, now: float) -> None:
        if now - self._swept < self._FORGET_AFTER:
            return
        self._swept = now
        for key in [k for k, v in self._seen.items() if now - v[1] > self._FORGET_AFTER]:
            del self._seen[key]


def group_lags(
    metric: KafkaMetric,
    group: str,
    read: int,
    read_at: float,
    partitions: Iterable[tuple[str, int, PartitionOffsets]],
    persistent: PersistentLag,
) -> list[PartitionLag]:
    """Per-partition lag of a group's selected partitions, with persistent lag excluded if asked."""
    result = []
    for topic, partition, offsets in partitions:
        lag = partition_lag(offsets, metric)
        counted = lag
        if metric.exclude_persistent_lag:
            before = persistent.previous((metric.key, group, topic, partition), read, read_at, offsets.committed)
            if before is not None and before == offsets.committed:
                counted = 0  # the consumer made no progress over the window: stuck, not busy
        result.append(PartitionLag(topic, partition, counted, lag))
    return result
