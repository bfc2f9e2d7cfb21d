"""The lag rules (docs/protocols.md#kafka-lag, with the differences in adapter/sources/kafka/lag.py) and the
config checks, without a broker."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from adapter.config.kafka import KafkaMetric
from adapter.sources.kafka.groups import NO_COMMIT, PartitionOffsets
from adapter.sources.kafka.lag import (
    PartitionLag,
    PersistentLag,
    group_lags,
    partition_lag,
    served_lag,
    total_lag,
)

LABELS = {"group": {"required": True}, "topic": {}}


def metric(**params: object) -> KafkaMetric:
    return KafkaMetric(type="kafka", name="lag", source="kafka", labels=LABELS, **params)


def lags(*values: int) -> list[PartitionLag]:
    return [PartitionLag("t", p, v, v) for p, v in enumerate(values)]


@pytest.mark.parametrize(
    ("offsets", "params", "expected"),
    [
        (PartitionOffsets(committed=3, end=10, start=0), {}, 7),
        (PartitionOffsets(committed=NO_COMMIT, end=10, start=4), {}, 1),
        (PartitionOffsets(committed=NO_COMMIT, end=10, start=4), {"offset_reset_policy": "earliest"}, 6),
        (PartitionOffsets(committed=NO_COMMIT, end=0, start=0), {}, 1),
        # A commit below the log start points at records retention removed: the consumer resets.
        (PartitionOffsets(committed=50, end=210, start=200), {}, 1),
        (PartitionOffsets(committed=50, end=210, start=200), {"offset_reset_policy": "earliest"}, 10),
        (PartitionOffsets(committed=NO_COMMIT, end=10, start=4), {"scale_to_zero_on_invalid_offset": True}, 0),
        # A commit beyond the log end (topic recreated) is invalid, like no commit, under both policies.
        (PartitionOffsets(committed=50, end=10, start=2), {}, 1),
        (PartitionOffsets(committed=50, end=10, start=2), {"offset_reset_policy": "earliest"}, 8),
        (
            PartitionOffsets(committed=50, end=10, start=2),
            {"offset_reset_policy": "earliest", "scale_to_zero_on_invalid_offset": True},
            0,
        ),
    ],
)
def test_partition_lag(offsets: PartitionOffsets, params: dict[str, object], expected: int) -> None:
    assert partition_lag(offsets, metric(**params)) == expected


@pytest.mark.parametrize(
    ("values", "params", "expected"),
    [
        ((100, 0, 0), {}, 30),  # capped at one consumer per partition: 3 x 10
        ((100, 0, 0), {"allow_idle_consumers": True}, 100),
        ((100, 0, 0), {"limit_to_partitions_with_lag": True}, 10),
        ((5, 0, 0), {}, 5),
        # 6 partitions, 25 lag at threshold 10: 3 consumers would do, and 3 divides 6.
        ((25, 0, 0, 0, 0, 0), {"ensure_even_distribution_of_partitions": True}, 30),
        # 4 consumers would do, but 4 does not divide 6: 6.
        ((35, 0, 0, 0, 0, 0), {"ensure_even_distribution_of_partitions": True}, 60),
        # No lag stays no lag (KEDA rounded it up to one consumer).
        ((0, 0, 0, 0, 0, 0), {"ensure_even_distribution_of_partitions": True}, 0),
    ],
)
def test_total_lag_caps(values: tuple[int, ...], params: dict[str, object], expected: int) -> None:
    assert total_lag(lags(*values), metric(**params))[0] == expected


@given(
    st.lists(st.integers(min_value=0, max_value=10_000), min_size=1, max_size=40),
    st.integers(min_value=1, max_value=500),
    st.booleans(),
    st.booleans(),
)
def test_never_more_consumers_than_partitions(values: list[int], threshold: int, limit: bool, even: bool) -> None:
    params = {"lag_threshold": threshold, "limit_to_partitions_with_lag": limit}
    params["ensure_even_distribution_of_partitions"] = even
    value, with_persistent = total_lag(lags(*values), metric(**params))
    bound = sum(1 for v in values if v > 0) if limit else len(values)
    assert value // threshold <= bound
    assert with_persistent == sum(values)
    assert (value == 0) == (sum(values) == 0)  # never a zero that is not there, never lag from nothing


def test_persistent_lag_compares_with_the_previous_read_only() -> None:
    tracker = PersistentLag(window=0.0)
    stuck = metric(exclude_persistent_lag=True)
    offsets = [("t", 0, PartitionOffsets(committed=2, end=5, start=0))]
    assert [p.lag for p in group_lags(stuck, "g", 1, 1.0, offsets, tracker)] == [3]  # first sight counts
    assert [p.lag for p in group_lags(stuck, "g", 1, 1.0, offsets, tracker)] == [3]  # same read, another series
    second = group_lags(stuck, "g", 2, 2.0, offsets, tracker)
    assert [(p.lag, p.lag_with_persistent) for p in second] == [(0, 3)]
    moved = [("t", 0, PartitionOffsets(committed=4, end=5, start=0))]
    assert [p.lag for p in group_lags(stuck, "g", 3, 3.0, moved, tracker)] == [1]


def test_persistent_lag_does_not_depend_on_how_often_a_series_is_evaluated() -> None:
    # Reads every 0.8 s (the poller's), each evaluated (woken at each change); the consumer commits every
    # 4 s. Compared read to read it looked stuck 4 reads in 5, so waking the series made it flap.
    tracker = PersistentLag(window=5.0)
    busy = metric(exclude_persistent_lag=True, allow_idle_consumers=True)
    counted = []
    for read in range(1, 40):
        at = read * 0.8
        commit = int(at // 4) * 10
        offsets = [("t", 0, PartitionOffsets(committed=commit, end=commit + 50, start=0))]
        counted += [p.lag for p in group_lags(busy, "g", read, at, offsets, tracker)]
    assert counted == [50] * 39
    # A consumer that stopped: persistent once a read at least the window older has the same commit.
    stopped = [("t", 0, PartitionOffsets(committed=500, end=550, start=0))]
    values = [group_lags(busy, "g", read, read * 0.8, stopped, tracker)[0].lag for read in range(40, 50)]
    assert values == [50] * 7 + [0] * 3  # read 47 at 37.6 s is the first with read 40 (32 s) 5 s or more before


def test_persistent_lag_keeps_one_consumer_awake() -> None:
    # A group at zero replicas: nobody commits, so all lag is persistent and excluded; KEDA keeps it
    # active, which here means a value worth one replica.
    stuck = [PartitionLag("t", 0, 0, 40), PartitionLag("t", 1, 0, 0)]
    assert served_lag(stuck, metric(exclude_persistent_lag=True)) == 1
    assert served_lag(stuck, metric(exclude_persistent_lag=True, activation_lag_threshold=5)) == 6
    assert served_lag(stuck, metric(exclude_persistent_lag=True, activation_lag_threshold=50)) == 0
    assert served_lag(stuck, metric(exclude_persistent_lag=True, activation_lag_threshold=30)) == 10
    moving = [PartitionLag("t", 0, 25, 40)]
    assert served_lag(moving, metric(exclude_persistent_lag=True)) == 10  # capped: one partition
    assert served_lag([PartitionLag("t", 0, 0, 0)], metric(exclude_persistent_lag=True)) == 0


def test_invalid_offsets_count_in_persistent_lag_detection() -> None:
    tracker = PersistentLag(window=0.0)
    stuck = metric(exclude_persistent_lag=True, offset_reset_policy="earliest")
    offsets = [("t", 0, PartitionOffsets(committed=NO_COMMIT, end=5, start=1))]
    assert [p.lag for p in group_lags(stuck, "g", 1, 1.0, offsets, tracker)] == [4]
    assert [p.lag for p in group_lags(stuck, "g", 2, 2.0, offsets, tracker)] == [0]


def test_activation_follows_activation_lag_threshold() -> None:
    assert metric().activation_threshold == 1
    assert metric(activation_lag_threshold=50).activation_threshold == 51


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"labels": {"topic": {}}}, "labels.group must be declared"),
        ({"labels": {"group": {}}}, "required: true"),
        ({"labels": {"group": {"required": True}, "queue": {}}}, "mean nothing to a kafka metric"),
        ({"allow_idle_consumers": True, "limit_to_partitions_with_lag": True}, "cannot both be true"),
        ({"lag_threshold": 0}, "greater than 0"),
        ({"offset_reset_policy": "smallest"}, "'latest' or 'earliest'"),
    ],
)
def test_metric_config_refused(fields: dict[str, object], problem: str) -> None:
    document: dict[str, object] = {"type": "kafka", "name": "lag", "source": "kafka", "labels": LABELS} | fields
    with pytest.raises(ValidationError, match=problem):
        KafkaMetric.model_validate(document)


def test_persistent_lag_keeps_a_bounded_history_however_often_the_group_is_read() -> None:
    # Reads every millisecond for 12 s (offsets_max_age 0 and a busy cache): a consumer committing every 4 s
    # is never stuck, and what is kept for the comparison stays a few dozen reads, not one per read.
    tracker = PersistentLag(window=5.0)
    busy = metric(exclude_persistent_lag=True, allow_idle_consumers=True)
    counted: set[int] = set()
    for read in range(1, 12_000):
        at = read / 1000
        commit = int(at // 4) * 10
        offsets = [("t", 0, PartitionOffsets(committed=commit, end=commit + 50, start=0))]
        counted.update(p.lag for p in group_lags(busy, "g", read, at, offsets, tracker))
        assert len(tracker._seen[(busy.key, "g", "t", 0)][0]) <= 32 + 3
    assert counted == {50}
