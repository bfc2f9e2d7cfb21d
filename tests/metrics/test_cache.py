"""The catalogue and the series cache: validation, singleflight, staleness, idle drop, bounds, push."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from decimal import Decimal

import pytest
from prometheus_client import REGISTRY

from adapter.config.base import SelectorLabel
from adapter.config.server import CacheConfig
from adapter.config.static import StaticMetric, StaticSeries, StaticSource
from adapter.metrics.cache import MetricCache
from adapter.metrics.catalogue import Catalogue
from adapter.metrics.errors import BadSelector, MetricNotFound, MetricUnavailable
from adapter.sources.base import Sample, Source, SourceError, SourceQuery
from adapter.sources.static import StaticValues


class ScriptedSource(Source):
    """A test stand-in for a queue system: answers with `value`, or fails with `failure`, and counts queries."""

    def __init__(self) -> None:
        super().__init__()
        self.value = Decimal(7)
        self.failure: str | None = None
        self.queries = 0  # reads started
        self.picked = 0  # reads that took their answer: `value` and `failure` may change for the next one
        self.delay = 0.0
        self.watched: list[SourceQuery] = []

    async def query(self, query: SourceQuery) -> list[Sample]:
        self.queries += 1
        await asyncio.sleep(self.delay)
        self.picked += 1
        if self.failure is not None:
            raise SourceError(self.failure)
        return [Sample(self.value)]

    def watch(self, query: SourceQuery) -> None:
        self.watched.append(query)

    def unwatch(self, query: SourceQuery) -> None:
        self.watched.remove(query)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def metric(**overrides: object) -> StaticMetric:
    fields: dict[str, object] = {
        "name": "Jobs",
        "type": "static",
        "source": "q",
        "labels": {"queue": SelectorLabel(pattern="[a-z]+")},
    }
    fields.update(overrides)
    return StaticMetric.model_validate(fields)


def make_cache(source: Source, clock: Clock | None = None, **config: object) -> MetricCache:
    settings = CacheConfig.model_validate({"interval": 3600, "max_staleness": 60, **config})
    return MetricCache(Catalogue([metric()]), {"q": source}, settings, clock=clock or Clock())


async def test_concurrent_cold_reads_share_one_query() -> None:
    source = ScriptedSource()
    source.delay = 0.05
    cache = make_cache(source)
    readings = await asyncio.gather(*(cache.read("jobs", "default", "queue=a") for _ in range(20)))
    assert source.queries == 1
    assert {r.value for r in readings} == {Decimal(7)}
    assert readings[0].labels == {"queue": "a"}
    assert readings[0].metric == "Jobs"
    await cache.close()


async def test_metric_names_match_case_insensitively() -> None:
    cache = make_cache(ScriptedSource())
    assert (await cache.read("JOBS", "default", "")).value == Decimal(7)
    await cache.close()


async def test_a_failed_refresh_serves_the_last_value_until_it_is_stale() -> None:
    source = ScriptedSource()
    clock = Clock()
    cache = make_cache(source, clock, interval=1)
    assert (await cache.read("jobs", "ns", "")).value == 7
    source.failure = "broker down"
    source.value = Decimal(0)  # must never be served: the source failed
    clock.now += 30
    assert (await cache.read("jobs", "ns", "")).value == 7
    clock.now += 31
    with pytest.raises(MetricUnavailable, match=r"older than max_staleness 60s; latest error: source q: broker down"):
        await cache.read("jobs", "ns", "")
    source.failure = None
    clock.now += 2
    assert (await cache.read("jobs", "ns", "")).value == 0
    await cache.close()


async def test_a_cold_series_whose_source_fails_answers_503_not_zero() -> None:
    source = ScriptedSource()
    source.failure = "authentication failed"
    cache = make_cache(source)
    with pytest.raises(MetricUnavailable, match="has no value: source q: authentication failed"):
        await cache.read("jobs", "ns", "")
    await cache.close()


async def test_a_hung_source_times_out_with_a_message_naming_the_limit() -> None:
    source = ScriptedSource()
    source.delay = 5
    cache = make_cache(source, query_timeout=0.05)
    with pytest.raises(MetricUnavailable, match=r"did not answer within 0.05s \(cache.query_timeout\)"):
        await cache.read("jobs", "ns", "")
    await cache.close()


async def tick(clock: Clock, seconds: float) -> None:
    """Move the cache's clock and give its schedule (which re-reads the clock every `interval`, 0.02 s here) a turn."""
    clock.now += seconds
    await asyncio.sleep(0.05)


async def test_an_idle_series_costs_no_reads_and_is_dropped_after_idle_ttl() -> None:
    source = ScriptedSource()
    clock = Clock()
    cache = make_cache(source, clock, interval=0.02, idle_ttl=100)
    await cache.read("jobs", "ns", "")
    for _ in range(5):
        await tick(clock, 10)
    assert source.queries == 1  # the old cache read it every interval while it waited for idle_ttl
    assert cache.series_count() == 1
    assert source.watched == []  # nobody is around for its changes: the source no longer follows them
    await tick(clock, 51)
    assert cache.series_count() == 0
    assert source.watched == []
    await cache.close()


async def test_a_new_series_is_followed_for_unwatch_after_so_an_hpa_s_second_ask_finds_it_watched() -> None:
    source = ScriptedSource()
    clock = Clock()
    cache = make_cache(source, clock, interval=0.02, idle_ttl=1000)  # unwatch_after: 30 s by default
    await cache.read("jobs", "ns", "")
    await tick(clock, 15)
    assert len(source.watched) == 1
    await tick(clock, 15.1)
    assert source.watched == []
    await cache.close()


async def test_a_series_is_watched_while_its_asker_is_around_and_again_when_it_comes_back() -> None:
    source = ScriptedSource()
    clock = Clock()
    cache = make_cache(source, clock, interval=0.02, idle_ttl=1000, unwatch_after=1)
    for ask in range(4):  # asked every 15 s, as an HPA does
        await cache.read("jobs", "ns", "")
        assert len(source.watched) == 1
        await tick(clock, 14.9)
        # After one ask nobody knows when the next comes: followed for `interval`; then till the next is late.
        assert len(source.watched) == (1 if ask else 0)
        await tick(clock, 0.1)
    await tick(clock, 1)  # 16 s since the last ask: the next one (due at 15 s) is more than interval/2 late
    assert source.watched == []
    queries = source.queries
    for _ in range(5):
        await tick(clock, 15)
    assert source.queries == queries  # not watched: no pushed change and no refresh
    await cache.read("jobs", "ns", "")
    assert len(source.watched) == 1  # the asker is back: followed again at once
    unsubscribe = cache.subscribe(next(iter(cache._series)), lambda _reading: None)
    await tick(clock, 100)
    assert len(source.watched) == 1  # subscribed: watched however long nobody reads it
    unsubscribe()
    await tick(clock, 0)
    assert source.watched == []
    await cache.close()


async def test_a_series_asked_once_a_minute_is_read_about_once_a_minute_and_served_fresh() -> None:
    source = ScriptedSource()
    clock = Clock()
    cache = make_cache(source, clock, interval=0.02)
    asks = 10
    for minute in range(asks):
        source.value = Decimal(minute)
        await tick(clock, 59.99)  # the refresh planned for the next ask happens half an interval before it
        clock.now += 0.01
        reading = await cache.read("jobs", "ns", "")
        if minute >= 2:  # once the asks have a period, each finds a value read just before it
            assert reading.value == minute
    assert asks <= source.queries <= asks + 1
    await tick(clock, 120)
    assert source.queries <= asks + 2  # the asker stopped: at most the one refresh planned for it
    await cache.close()


async def test_an_unforeseen_ask_is_served_at_once_and_refreshes_at_the_next_tick() -> None:
    source = ScriptedSource()
    clock = Clock()
    cache = make_cache(source, clock, interval=1)
    await cache.read("jobs", "ns", "")
    source.value = Decimal(9)
    source.delay = 3600  # a read that waited for the source would hang
    clock.now += 5  # older than interval, younger than max_staleness
    async with asyncio.timeout(1):
        assert (await cache.read("jobs", "ns", "")).value == 7
    # The refresh started by the ask, in the background: at the next tick, which a test's clock that jumped
    # reaches within the schedule's max_sleep (interval) of real time.
    await _until(lambda: source.queries == 2)
    source.delay = 0
    clock.now += 1
    await cache.read("jobs", "ns", "")  # the refresh in flight serves this ask too: no second one
    assert source.queries == 2
    await cache.close()


async def test_a_subscribed_series_is_refreshed_every_interval_until_unsubscribed() -> None:
    source = ScriptedSource()
    clock = Clock()
    cache = make_cache(source, clock, interval=0.02)
    key, _ = cache.catalogue.resolve("jobs", "ns", "")
    pushed: list[Decimal] = []
    unsubscribe = cache.subscribe(key, lambda reading: pushed.append(reading.value))
    await cache.read("jobs", "ns", "")
    for value in range(1, 4):
        source.value = Decimal(value)
        await tick(clock, 0.02)
    # Its refresh may still be on its way after the tick's turn (a loaded machine stalls the loop mid-read).
    await _until(lambda: pushed[-1] == 3)
    unsubscribe()
    queries = source.queries
    for _ in range(6):
        await tick(clock, 1)
    # Unsubscribed, the series still has the asker of the read above: at most the one refresh planned for its
    # next ask may follow (depending on whether one was due when the stream left, and started whenever a stalled
    # loop gets to it), then nothing: six intervals of pushing would be six.
    assert source.queries <= queries + 1
    await cache.close()


async def test_the_number_of_series_is_bounded() -> None:
    cache = make_cache(ScriptedSource(), max_series=2)
    await cache.read("jobs", "ns", "queue=a")
    await cache.read("jobs", "ns", "queue=b")
    await cache.read("jobs", "ns", "queue=a")  # an existing series is not a new one
    with pytest.raises(MetricUnavailable, match=r"cache.max_series"):
        await cache.read("jobs", "ns", "queue=c")
    await cache.close()


async def test_a_pushed_change_refreshes_at_once() -> None:
    source = ScriptedSource()
    cache = make_cache(source)  # interval one hour: only a push can refresh
    await cache.read("jobs", "ns", "")
    source.value = Decimal(42)
    source.changed(source.watched[0])
    await _served(cache, 42)
    await cache.close()


class EverChanging(ScriptedSource):
    """A queue its producers write to without pause: every read finds it changed again (a push per read)."""

    async def query(self, query: SourceQuery) -> list[Sample]:
        samples = await super().query(query)
        self.changed(query)
        return samples


async def test_changes_without_pause_refresh_once_per_push_interval() -> None:
    """Any producer of a queue could make the adapter read it once per round trip (3,000 reads in 0.3 s of
    one in-process series): pushed changes refresh a series at most once per `cache.push_interval`."""
    source = EverChanging()
    clock = Clock()  # stands still: within one push_interval of the first push's read for the whole test
    cache = make_cache(source, clock)
    await cache.read("jobs", "ns", "")  # its read finds a change: read once more at once (the first push)
    await _until(lambda: source.picked == 2)
    await asyncio.sleep(0.3)  # and no more
    assert source.queries == 2
    clock.now += 0.25  # one push_interval later: the change pending since then is read, once
    await _until(lambda: source.picked == 3)
    await asyncio.sleep(0.1)
    assert source.queries == 3
    await cache.close()


async def test_the_edge_from_zero_is_read_at_once_right_after_another_push() -> None:
    """Bursty traffic: the last request ends (that change is read), a new one comes right after. The change
    from 0 must not wait for `push_interval` (5 s here, and the clock stands still: only the edge rule can
    read it; before, it waited the full push_interval after the read of the change to 0)."""
    source = ScriptedSource()
    cache = make_cache(source, push_interval=5)
    await cache.read("jobs", "ns", "")
    source.value = Decimal(0)
    source.changed(source.watched[0])  # the first push after a quiet spell: read at once
    await _until(lambda: source.picked == 2)
    source.value = Decimal(1)
    source.changed(source.watched[0])  # right after: within push_interval of that read
    await _until(lambda: source.picked == 3)
    await _served(cache, 1)
    source.value = Decimal(0)
    source.changed(source.watched[0])  # any other change keeps its coalescing
    await asyncio.sleep(0.3)
    assert source.queries == 3
    await cache.close()


async def test_inactive_to_active_is_read_at_once() -> None:
    """A series below its metric's activation_threshold (KEDA's inactive) is at rest too: the change that may
    make it active is read at once, right after another push."""
    source = ScriptedSource()
    settings = CacheConfig.model_validate({"interval": 3600, "max_staleness": 60, "push_interval": 5})
    cache = MetricCache(Catalogue([metric(activation_threshold=3)]), {"q": source}, settings, clock=Clock())
    await cache.read("jobs", "ns", "")  # 7: active
    source.value = Decimal(2)
    source.changed(source.watched[0])  # the first push: read at once, now inactive
    await _until(lambda: source.picked == 2)
    source.value = Decimal(4)
    source.changed(source.watched[0])
    await _until(lambda: source.picked == 3)
    await _served(cache, 4)
    await cache.close()


def edge_reads_at_rest(found: str = "at_rest") -> float:
    labels = {"metric": "jobs", "found": found}
    return REGISTRY.get_sample_value("zeroscale_cache_edge_reads_total", labels) or 0.0


async def at_rest_and_pushed_once(source: ScriptedSource, cache: MetricCache) -> None:
    """The series read at 0, then a push read at once (the first after a quiet spell): the next push to the
    series at rest comes within push_interval of that read."""
    source.value = Decimal(0)
    await cache.read("jobs", "ns", "")
    source.changed(source.watched[0])
    await _until(lambda: source.picked == 2)


async def test_a_failed_early_read_is_counted_as_failed_and_the_next_change_waits_its_turn() -> None:
    """An early read for the edge that fails is not "still at rest" (what an operator reads as a queue filled
    and drained); the next change waits its turn (a failing source is not read once per round trip)."""
    source = ScriptedSource()
    clock = Clock()
    cache = make_cache(source, clock, push_interval=5)
    await at_rest_and_pushed_once(source, cache)
    at_rest, failed = edge_reads_at_rest(), edge_reads_at_rest("failed")
    source.failure = "broker down"
    source.changed(source.watched[0])  # at rest: read at once, and it fails
    await _until(lambda: source.picked == 3)
    await _until(lambda: edge_reads_at_rest("failed") - failed == 1)
    assert edge_reads_at_rest() == at_rest
    source.failure, source.value = None, Decimal(1)
    source.changed(source.watched[0])
    await asyncio.sleep(0.3)
    assert source.queries == 3
    clock.now += 5  # its turn: read
    await _until(lambda: source.picked == 4)
    await _served(cache, 1)
    await cache.close()


async def test_a_value_refused_leaves_the_series_at_rest_so_the_next_change_is_read_at_once() -> None:
    """0 (KEDA heard inactive), then a value the HPA could not read (refused: KEDA hears nothing), then 1:
    the edge from zero for KEDA, read at once. Before, a refused value put the series out of rest, and the 1
    waited for push_interval."""
    source = ScriptedSource()
    source.value = Decimal(0)
    cache = make_cache(source, push_interval=5)
    await cache.read("jobs", "ns", "")
    source.value = Decimal("NaN")
    source.changed(source.watched[0])  # the first push: read at once, refused
    await _until(lambda: source.picked == 2)
    source.value = Decimal(1)
    source.changed(source.watched[0])  # within push_interval of that read
    await _until(lambda: source.picked == 3)
    await _served(cache, 1)
    await cache.close()


async def test_pushes_that_leave_a_series_at_rest_cost_two_reads_per_push_interval() -> None:
    """A queue filled and drained without pause: every read finds 0 and a new change. An early read that
    found the series still at rest makes the next push wait its turn: two reads per `push_interval`."""
    source = EverChanging()
    source.value = Decimal(0)
    clock = Clock()
    before = edge_reads_at_rest()
    cache = make_cache(source, clock)
    await cache.read("jobs", "ns", "")  # a change during it: read at once (the first push), then once early
    await _until(lambda: source.picked == 3)
    await asyncio.sleep(0.3)  # and no more
    assert source.queries == 3
    clock.now += 0.25  # its turn: read, and once early again
    await _until(lambda: source.picked == 5)
    await asyncio.sleep(0.1)
    assert source.queries == 5
    assert edge_reads_at_rest() - before == 2  # counted, so the cost is seen
    await cache.close()


async def pushed_while_nobody_wanted_it(source: ScriptedSource, clock: Clock) -> MetricCache:
    """A series at 0, read for a push 1 s before its asker counted as gone (`interval` 10 s after its only ask);
    then the change to 1 is pushed while nobody wants the series: not read."""
    source.value = Decimal(0)
    cache = make_cache(source, clock, interval=10)
    await cache.read("jobs", "ns", "")
    clock.now += 9
    source.changed(source.watched[0])  # wanted: read at once
    await _until(lambda: source.picked == 2)
    clock.now += 1.5
    source.value = Decimal(1)
    source.changed(source.watched[0])  # nobody wants it now
    await asyncio.sleep(0.1)
    assert source.queries == 2
    clock.now += 0.5
    return cache


async def test_a_change_pushed_while_nobody_wanted_the_series_is_read_when_it_is_asked_for() -> None:
    """The asker comes back 2 s after that read: it is served the 0 (younger than `interval`), and the pushed
    change is read at once. Before, nothing read it until the refresh planned for the next ask (8 s later);
    the 1 may be the edge from zero."""
    source = ScriptedSource()
    cache = await pushed_while_nobody_wanted_it(source, Clock())
    assert (await cache.read("jobs", "ns", "")).value == 0
    await _until(lambda: source.picked == 3)
    await _served(cache, 1)
    await cache.close()


async def test_a_change_pushed_while_nobody_wanted_the_series_is_read_when_it_is_subscribed() -> None:
    """A KEDA stream reopened (its operator restarted): the change pushed meanwhile is read at once, not
    `interval` after the latest read (8 s later here)."""
    source = ScriptedSource()
    clock = Clock()
    cache = await pushed_while_nobody_wanted_it(source, clock)
    readings: list[Decimal] = []
    key, _ = cache.catalogue.resolve("jobs", "ns", "")
    unsubscribe = cache.subscribe(key, lambda reading: readings.append(reading.value))
    await _until(lambda: readings == [Decimal(1)])
    unsubscribe()
    await cache.close()


async def _served(cache: MetricCache, expected: int) -> None:
    """Until the cache serves `expected`: a read's value is stored by its own task, loop turns after it took its
    answer (on a loaded machine, an ask right then was served the one before)."""
    async with asyncio.timeout(10):
        while (await cache.read("jobs", "ns", "")).value != expected:  # noqa: ASYNC110 - reads are the behaviour
            await asyncio.sleep(0.005)


async def _until(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(10):
        while not condition():  # noqa: ASYNC110 - the cache's state is plain attributes
            await asyncio.sleep(0.005)


@pytest.mark.parametrize(
    ("name", "namespace", "selector", "error", "message"),
    [
        ("nope", "ns", "", MetricNotFound, "could not find the metric nope"),
        ("jobs", "ns", "queue in (", BadSelector, "unable to parse label selector"),
        ("jobs", "ns", "other=1", BadSelector, "label 'other' is not a selector label of metric Jobs"),
        ("jobs", "ns", "queue=UPPER", BadSelector, "does not match the pattern"),
    ],
)
def test_the_catalogue_refuses_bad_requests(
    name: str, namespace: str, selector: str, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        Catalogue([metric()]).resolve(name, namespace, selector)


def test_required_labels_and_namespaces_are_enforced() -> None:
    required = metric(labels={"queue": SelectorLabel(required=True)}, namespaces=["team-a"])
    catalogue = Catalogue([required])
    with pytest.raises(BadSelector, match="needs the selector to give queue"):
        catalogue.resolve("jobs", "team-a", "")
    with pytest.raises(MetricNotFound, match="for namespace team-b"):
        catalogue.resolve("jobs", "team-b", "queue=x")
    key, query = catalogue.resolve("jobs", "team-a", "queue in (y,x)")
    assert key.selector == "queue in (x,y)"
    assert query.params == {"queue": ("x", "y")}


async def test_static_source_sums_matching_series_and_refuses_no_match() -> None:
    source = StaticValues(
        StaticSource(
            name="q",
            type="static",
            series=[
                StaticSeries(labels={"queue": "a"}, value=Decimal("1.5")),
                StaticSeries(labels={"queue": "b"}, value=Decimal(2)),
            ],
        )
    )
    cache = make_cache(source)
    assert (await cache.read("jobs", "ns", "")).value == Decimal("3.5")
    assert (await cache.read("jobs", "ns", "queue=b")).value == 2
    with pytest.raises(MetricUnavailable, match="no static series matches"):
        await cache.read("jobs", "ns", "queue=zzz")
    await cache.close()


async def test_spellings_of_one_selector_share_a_series_and_are_forgotten_with_it() -> None:
    source = ScriptedSource()
    clock = Clock()
    cache = make_cache(source, clock, interval=0.02, idle_ttl=100, max_series=1)
    await cache.read("jobs", "ns", "queue in (a,b)")
    await cache.read("JOBS", "ns", "queue in (b, a)")  # same series: max_series=1 is not exceeded
    assert cache.series_count() == 1
    clock.now += 101
    await _until(lambda: cache.series_count() == 0)
    queries = source.queries
    source.value = Decimal(9)
    assert (await cache.read("jobs", "ns", "queue in (a,b)")).value == 9  # a new series, a new query
    assert source.queries == queries + 1
    await cache.close()
