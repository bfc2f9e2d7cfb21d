"""The series cache: refresh as often as asked, one shared query per cold read, staleness, a size bound.

A series (metric, namespace, selector) is born on its first read, which waits for the source
(concurrent first reads share one query). After that it is read from the source about as often as
it is asked for, never more often than its `interval`, and nobody waits on the source again while
the value is younger than `max_staleness`:

- an ask that finds the value younger than `interval` is served; once asks have a period (the
  HPA asks every sync, 15 s by default), the next refresh is planned half an `interval` before
  the next ask is due, so the next ask finds a value younger than `interval` too;
- an ask that finds it older than `interval` (an unforeseen ask) is served that value and a
  refresh is made at the next tick (stale-while-revalidate);
- an ask that finds no value younger than `max_staleness` waits for a refresh; if the last
  refresh failed, it is answered 503 with the cause;
- a subscribed series (KEDA's StreamIsActive) is asked continuously: refreshed every `interval`;
- a change pushed by the source (keyspace notification, Kafka round) refreshes at the next tick
  a series that is subscribed or whose asker is still around (its next ask is not half an
  `interval` late, or it was asked within `interval` when its asks have no period yet; a change
  pushed while nobody was around is read at the next ask or subscription, as if pushed then), one
  refresh in flight at a time and, for pushes without pause, one per `push_interval`, except the
  edge from rest: a change to a series at rest (its value 0, or below its metric's
  `activation_threshold`) is read at once, whenever the latest read was, because it may be the one
  that wakes a workload from zero (docs/architecture.md#edge-from-zero);
- the source follows a series' changes (`Source.watch`: a Kafka group polled every round, Redis
  keyspace notifications) only while it is subscribed or its asker is around, by the same rule but
  for at least `unwatch_after` after each ask; a look that finds the asker gone then unwatches it,
  and the next ask or subscription watches it again;
- nothing else reads the source: a series nobody asks for costs at most the one refresh planned
  for an ask that did not come, and is dropped after `idle_ttl` without asks.

The work is driven by one schedule (adapter.metrics.schedule), not a coroutine per series: a
tick starts every due refresh in a plain loop, and a source batches the reads started together
(one Redis pipeline per node).

A failed refresh keeps the last good value until it is older than `max_staleness`; after that
the read fails with 503. No path produces a zero that the source did not report
(docs/architecture.md#no-fabricated-zero), nor a value the HPA would misread (a Quantity whose
milli-value overflows int64, NaN, infinity): those are errors of the series.

The table is shared by every caller, so no caller can take it from another: a full table
refuses NEW series (503 naming `cache.max_series`) and never evicts a live one, and one
namespace holds at most `cache.max_series_per_namespace` of it (503 naming that key). A series
that never answered is dropped after its first failure instead of being refreshed in the
background, and a failing series logs one line per minute with a count of the lines held back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal

from opentelemetry.trace import Span, SpanContext, SpanKind

from adapter.config.server import CacheConfig
from adapter.k8s_wire.quantity import unservable
from adapter.metrics.catalogue import Catalogue, SeriesKey
from adapter.metrics.errors import MetricUnavailable
from adapter.metrics.schedule import COALESCE, Schedule
from adapter.sources.base import Sample, Source, SourceError, SourceQuery
from adapter.telemetry import cache as telemetry
from adapter.telemetry import reads as spans
from adapter.telemetry import tracing
from adapter.telemetry.throttle import LogThrottle, held_back

log = logging.getLogger(__name__)

# Spellings of one series' selector remembered for the fast path ("a=1,b=2" and "b=2,a=1" are one series).
_REQUEST_FORMS_PER_SERIES = 4
# A failing series logs at most one warning per this many seconds.
_WARNING_INTERVAL = 60.0


@dataclass(frozen=True)
class Reading:
    """A value as served: the sum of a query's samples, with the labels the selector fixed."""

    metric: str
    value: Decimal
    labels: Mapping[str, str]
    timestamp: float  # wall-clock time of the source read
    series: int = 1  # source series (samples) summed into `value`


# Told of each new reading of a series it subscribed to.
ReadingListener = Callable[[Reading], None]


class _Series:
    def __init__(self, key: SeriesKey, query: SourceQuery, source: Source, config: CacheConfig) -> None:
        metric = query.metric
        self.key = key
        self.query = query
        self.source = source
        self.interval = metric.interval if metric.interval is not None else config.interval
        self.max_staleness = metric.max_staleness if metric.max_staleness is not None else config.max_staleness
        self.reading: Reading | None = None
        self.read_at = 0.0  # monotonic time of `reading`
        self.answered = False  # whether any refresh ever succeeded
        self.error: str | None = None
        self.failed_at = 0.0
        self.last_access = 0.0  # monotonic time of the latest ask
        self.ask_period: float | None = None  # average time between asks, once there were two
        self.refreshed_at = -float("inf")  # monotonic time the latest refresh started
        self.stale_asked = False  # an ask found the value older than `interval` and no refresh in flight
        self.changed = False  # the source pushed a change since the latest refresh started
        self.push_read_at = -float("inf")  # monotonic time the latest refresh for a pushed change started
        # The latest good value is 0 or below the activation threshold (KEDA last heard inactive): a pushed
        # change is read at once (_after_push). A failed read, or a value refused, leaves it as it was.
        self.activation = Decimal(repr(metric.activation_threshold))
        self.resting = False
        self.edge = False  # the next refresh is a push read made early because the series was at rest
        self.missed = False  # the latest refresh was such a read and found it still at rest, or failed (_after_push)
        self.due: float | None = None  # when the schedule looks at it next
        self.watched = True  # the source pushes its changes (source.watch), see MetricCache._wanted
        self.in_flight: asyncio.Task[None] | None = None
        self.refresh_span: Span | None = None  # the span of the refresh in flight (tracing on)
        self.served_by: SpanContext | None = None  # the span of the refresh that read `reading` (tracing on)
        self.requests: list[tuple[str, str, str]] = []  # spellings of this series' requests, see _by_request
        self.labels = {key: ",".join(values) for key, values in query.params.items()}

    def fresh(self, now: float) -> bool:
        return self.reading is not None and now - self.read_at <= self.max_staleness


class MetricCache:
    def __init__(
        self,
        catalogue: Catalogue,
        sources: Mapping[str, Source],
        config: CacheConfig,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._catalogue = catalogue
        self._sources = sources
        self._config = config
        self._clock = clock
        self._series: dict[SeriesKey, _Series] = {}
        self._by_query: dict[SourceQuery, _Series] = {}
        # Requests as they arrived (name, namespace, selector text) -> series: a warm read skips parsing and
        # validating the selector again, the largest cost of the API's hot path. Bounded per series.
        self._by_request: dict[tuple[str, str, str], _Series] = {}
        self._listeners: dict[SeriesKey, list[ReadingListener]] = {}
        self._per_namespace: dict[str, int] = {}
        self._warnings = LogThrottle(_WARNING_INTERVAL, clock)
        # Re-reading the clock at least every interval (or second) lets a test's clock move the schedule.
        self._schedule: Schedule[_Series] = Schedule(clock, self._visit, min(config.interval, 1.0))
        for source in sources.values():
            source.set_change_listener(self._on_change)

    @property
    def catalogue(self) -> Catalogue:
        return self._catalogue

    def subscribe(self, key: SeriesKey, listener: ReadingListener) -> Callable[[], None]:
        """Call `listener` after every successful refresh of the series `key`; returns the unsubscribe function.

        For pushing changes (KEDA's StreamIsActive) without polling. The listener runs on the event loop
        inside the refresh: it must only record the reading, never block or raise. A subscribed series
        counts as asked continuously (refreshed every `interval`); only reading it keeps it in the table.
        """
        listeners = self._listeners.setdefault(key, [])
        listeners.append(listener)
        series = self._series.get(key)
        if series is not None:
            self._watch(series)
            now = self._clock()
            self._schedule.at(series, max(now, series.refreshed_at + series.interval))
            self._pending_push(series, now)

        def unsubscribe() -> None:
            listeners.remove(listener)
            if not listeners and self._listeners.get(key) is listeners:
                del self._listeners[key]
                left = self._series.get(key)
                if left is not None:  # look at once: nobody may want its changes any more
                    self._schedule.at(left, self._clock())

        return unsubscribe

    def series_count(self) -> int:
        return len(self._series)

    async def read(self, name: str, namespace: str, selector: str, span: Span | None = None) -> Reading:
        """The current value of a series; raises MetricError (404, 400 or 503). `span`: the asking request's (tracing
        on), told how it was answered; a refresh it starts is its child."""
        request = (name.lower(), namespace, selector)
        series = self._by_request.get(request)
        if series is None:
            key, query = self._catalogue.resolve(name, namespace, selector)
            series = self._series.get(key) or self._create(key, query)
            self._remember(request, series)
        now = self._clock()
        self._asked(series, now)
        self._watch(series)
        outcome = "unavailable"
        if series.fresh(now):
            outcome = "hit"
            self._pending_push(series, now)
            if now - series.read_at > series.interval:
                outcome = "stale"
                if series.in_flight is None:  # served now, refreshed at the next tick
                    series.stale_asked = True
                    self._schedule.at(series, max(now, series.refreshed_at + series.interval))
            elif series.ask_period is not None:  # ready for the next ask
                self._schedule.at(series, self._planned(series))
        else:
            recently_failed = series.error is not None and now - series.failed_at < series.interval
            if series.in_flight is not None or not recently_failed:
                outcome = "refreshed" if series.in_flight is None else "joined"
                await asyncio.shield(self._refresh(series, span))
            if not series.fresh(self._clock()):
                if span is not None:
                    span.set_attribute(tracing.CACHE_OUTCOME, "unavailable")
                raise self._unavailable(series)
        assert series.reading is not None
        age = self._clock() - series.read_at
        telemetry.VALUE_AGE_SECONDS.labels(series.key.metric).observe(age)
        if span is not None:
            self._answered(span, series, outcome, age)
        return series.reading

    @staticmethod
    def _answered(span: Span, series: _Series, outcome: str, age: float) -> None:
        assert series.reading is not None
        span.set_attributes(
            {tracing.CACHE_OUTCOME: outcome, tracing.VALUE_AGE: age, tracing.SERIES: series.reading.series}
        )
        if outcome in ("hit", "stale"):  # (a refresh waited for is the span's child, or linked as joined)
            spans.link(span, series.served_by, "served")

    @staticmethod
    def _asked(series: _Series, now: float) -> None:
        gap = now - series.last_access
        if series.last_access and gap >= COALESCE:  # asks together (a burst, two HPAs at once) are one
            series.ask_period = gap if series.ask_period is None else (series.ask_period + gap) / 2
        series.last_access = now

    @staticmethod
    def _ahead(series: _Series) -> float:
        """Half an interval before the next ask is due: a refresh then is done when it comes."""
        assert series.ask_period is not None
        return series.last_access + series.ask_period - series.interval / 2

    def _planned(self, series: _Series) -> float:
        """The refresh for the next ask, never within `interval` of the latest."""
        return max(series.refreshed_at + series.interval, self._ahead(series))

    def _after_push(self, series: _Series, now: float) -> float:
        """When a pushed change is read: at once, but not within `push_interval` of the latest read for a push
        (changes without pause, from any producer of the queue, would be a read per source round trip). A
        change to a series at rest is read at once all the same: it may be the edge from zero, which wakes a
        workload, and must never wait (docs/architecture.md#edge-from-zero). Unless the latest read was such
        an early one and found it still at rest (a queue filled and drained without pause) or failed (a
        failing source is not read once per round trip): then it waits like any other, so a series at rest
        costs at most two reads per `push_interval`."""
        turn = series.push_read_at + self._config.push_interval
        if now < turn and series.resting and not series.missed:
            series.edge = True
            return now
        return max(now, turn)

    def _pending_push(self, series: _Series, now: float) -> None:
        """A change pushed while nobody wanted the series (so not read then) is read now that someone does,
        as if pushed now: else a value read before it is served until the next refresh for the asks or the
        subscription, up to `interval` later, though it may be the edge from zero (a KEDA stream reopened)."""
        if series.changed and series.in_flight is None:
            self._schedule.at(series, self._after_push(series, now))

    def _wanted(self, series: _Series, now: float) -> bool:
        """Someone asks for it: subscribed, an ask waits for fresher, or its asker is still around."""
        if series.stale_asked or self._listeners.get(series.key):
            return True
        if series.ask_period is None:
            return now - series.last_access < series.interval
        return now - series.last_access < series.ask_period + series.interval / 2  # the next ask is not late yet

    def _unwatch_at(self, series: _Series) -> float:
        """When the source stops following the series if nobody asks or subscribes before then: once it is
        not `_wanted` and `cache.unwatch_after` has passed since the latest ask."""
        if series.ask_period is None:
            unwanted = series.last_access + series.interval
        else:
            unwanted = series.last_access + series.ask_period + series.interval / 2
        return max(unwanted, series.last_access + self._config.unwatch_after)

    def _owed(self, series: _Series, now: float) -> bool:
        """A refresh is due now: an ask found the value old, a change was pushed, a subscribed series'
        interval is up, or the refresh planned for the next ask is due. Any other look (one planned for
        a time that has moved since) must not read the source again."""
        if series.stale_asked or series.changed:
            return True
        if self._listeners.get(series.key) and now >= series.refreshed_at + series.interval - COALESCE:
            return True
        if series.ask_period is None or series.refreshed_at >= self._ahead(series) - COALESCE:
            return False  # no asks to plan for, or the refresh for the next ask is done
        return now >= self._planned(series) - COALESCE

    def _watch(self, series: _Series) -> None:
        if not series.watched:
            series.watched = True
            series.source.watch(series.query)

    def _unwatch(self, series: _Series) -> None:
        """Nobody is around for its changes: the source stops following them (a Kafka group is no longer
        polled) until the next ask or subscription. A series nobody asks for costs the source nothing."""
        if series.watched:
            series.watched = False
            series.source.unwatch(series.query)

    def _unavailable(self, series: _Series) -> MetricUnavailable:
        telemetry.STALE_READS.labels(series.key.metric).inc()
        cause = series.error or "no value yet"
        name = series.query.metric.name
        if series.reading is None:
            return MetricUnavailable(f"metric {name} has no value: {cause}")
        age = self._clock() - series.read_at
        return MetricUnavailable(
            f"metric {name}: the last good value is {age:.0f}s old, older than max_staleness "
            f"{series.max_staleness:g}s; latest error: {cause}"
        )

    def _create(self, key: SeriesKey, query: SourceQuery) -> _Series:
        # New series are refused, live ones never evicted: what one caller asks must not fail another's answer.
        if len(self._series) >= self._config.max_series:
            raise self._refuse(
                "max_series",
                f"the cache already holds {len(self._series)} series (cache.max_series); "
                "raise cache.max_series or narrow the HPAs' selectors",
            )
        in_namespace = self._per_namespace.get(key.namespace, 0)
        if in_namespace >= self._config.max_series_per_namespace:
            raise self._refuse(
                "max_series_per_namespace",
                f"namespace {key.namespace} already has {in_namespace} series in the cache "
                "(cache.max_series_per_namespace); raise it or narrow the selectors used in this namespace",
            )
        self._per_namespace[key.namespace] = in_namespace + 1
        source = self._sources[query.metric.source]
        series = _Series(key, query, source, self._config)
        self._series[key] = series
        self._by_query[query] = series
        telemetry.SERIES.labels(key.metric).inc()
        source.watch(query)
        return series

    def _refuse(self, limit: str, message: str) -> MetricUnavailable:
        telemetry.SERIES_REFUSED.labels(limit).inc()
        suppressed = self._warnings.allow(limit)
        if suppressed is not None:
            log.warning("new series refused: %s%s", message, held_back(suppressed))
        return MetricUnavailable(message)

    def _remember(self, request: tuple[str, str, str], series: _Series) -> None:
        if len(series.requests) < _REQUEST_FORMS_PER_SERIES:
            series.requests.append(request)
            self._by_request[request] = series

    def _drop(self, series: _Series) -> None:
        for request in series.requests:
            self._by_request.pop(request, None)
        if self._series.pop(series.key, None) is not None:
            left = self._per_namespace.pop(series.key.namespace) - 1
            if left:
                self._per_namespace[series.key.namespace] = left
        self._by_query.pop(series.query, None)
        telemetry.SERIES.labels(series.key.metric).dec()
        with contextlib.suppress(KeyError):  # never read successfully: no value series was made
            telemetry.SERIES_VALUE.remove(series.key.metric, series.key.namespace, series.key.selector)
        self._unwatch(series)
        self._schedule.cancel(series)

    def _live(self, series: _Series) -> bool:
        return self._series.get(series.key) is series

    def _on_change(self, query: SourceQuery) -> None:
        series = self._by_query.get(query)
        if series is None:
            return
        series.changed = True
        now = self._clock()
        if series.in_flight is None and self._wanted(series, now):
            self._schedule.at(series, self._after_push(series, now))

    def _visit(self, series: _Series, now: float) -> None:
        """The schedule's call for a due series: drop it, refresh it, or look again when it could be dropped."""
        if not self._live(series):
            return
        if now - series.last_access > self._config.idle_ttl:
            self._drop(series)
        elif not series.answered and series.error is not None:
            # Never answered and failed: no background queries for it. A read recreates it (one
            # query per read at most, and none within `interval` of the failure, see read()).
            self._drop(series)
        elif series.in_flight is not None:
            pass  # its end schedules the next look
        elif not self._wanted(series, now):
            if now >= self._unwatch_at(series) - COALESCE:
                self._unwatch(series)
                self._schedule.at(series, series.last_access + self._config.idle_ttl)
            else:
                self._schedule.at(series, self._unwatch_at(series))
        elif self._owed(series, now):
            if series.changed:
                series.push_read_at = now
            self._refresh(series)
        else:  # a look planned for an ask that has moved since
            if series.ask_period is not None:
                self._schedule.at(series, self._planned(series))
            self._schedule.at(series, max(now + COALESCE, self._unwatch_at(series)))

    def _refresh(self, series: _Series, asker: Span | None = None) -> asyncio.Task[None]:
        """Start a refresh, or join the one in flight (singleflight). `asker`: the span of the request waiting for
        it (tracing on): the parent of the refresh it starts, linked to the one it joins."""
        if series.in_flight is None:
            series.refreshed_at = self._clock()
            series.stale_asked = series.changed = False
            span = None if tracing.TRACER is None else self._refresh_span(series, asker)
            series.refresh_span = span
            series.in_flight = asyncio.create_task(
                self._query(series) if span is None else self._traced_query(series, span)
            )
            series.in_flight.add_done_callback(lambda _: self._refreshed(series))
        elif asker is not None:
            spans.joined(series.refresh_span, asker)
        return series.in_flight

    @staticmethod
    def _refresh_span(series: _Series, asker: Span | None) -> Span | None:
        key = series.key
        span = spans.start(
            tracing.CACHE_REFRESH, asker, SpanKind.INTERNAL, {tracing.SOURCE: series.query.metric.source}
        )
        if span is not None:
            spans.describe_series(span, key.metric, key.namespace, key.selector)
        return span

    def _refreshed(self, series: _Series) -> None:
        """A refresh ended: plan the next look at the series."""
        series.in_flight = None
        if not self._live(series):
            return
        if series.edge:
            found = "failed" if series.error is not None else "at_rest" if series.resting else "active"
            telemetry.EDGE_READS.labels(series.key.metric, found).inc()
        series.missed, series.edge = series.edge and series.resting, False
        now = self._clock()
        schedule = self._schedule
        if not series.answered and series.error is not None:
            schedule.at(series, series.failed_at + series.interval)  # dropped then, see _visit
            return
        if series.changed and self._wanted(series, now):  # pushed while this refresh was in flight
            schedule.at(series, self._after_push(series, now))
        if self._listeners.get(series.key):
            schedule.at(series, series.refreshed_at + series.interval)
        if series.ask_period is not None and self._ahead(series) > series.refreshed_at + COALESCE:
            # This was not the refresh planned for the next ask (it came earlier): plan that one.
            schedule.at(series, self._planned(series))
        # When the asker may have gone: stop following the source's changes then (see _visit).
        schedule.at(series, max(now, self._unwatch_at(series)))
        schedule.at(series, series.last_access + self._config.idle_ttl)

    async def _traced_query(self, series: _Series, span: Span) -> None:
        """`_query` with its span current in the refresh's task, so the source's shared read finds its caller."""
        try:
            with spans.current_in_task(span):
                await self._query(series)
        finally:
            span.end()
            series.refresh_span = None

    async def _query(self, series: _Series) -> None:
        source_name = series.query.metric.source
        started = self._clock()
        asked_at = time.time()  # a value's timestamp is when the source was read, not when the answer came
        try:
            samples = await asyncio.wait_for(series.source.query(series.query), self._config.query_timeout)
            if not samples:
                raise SourceError("the source returned no value for this selector")
        except TimeoutError:
            self._failed(
                series,
                f"source {source_name} did not answer within {self._config.query_timeout:g}s (cache.query_timeout)",
            )
        except SourceError as err:
            self._failed(series, f"source {source_name}: {err}")
        except Exception as err:
            log.exception("query of %s failed unexpectedly", series.key)
            self._failed(series, f"source {source_name}: internal error {type(err).__name__}: {err}")
        else:
            self._store(series, samples, asked_at)
        finally:
            telemetry.SOURCE_QUERY_SECONDS.labels(source_name).observe(self._clock() - started)

    def _store(self, series: _Series, samples: list[Sample], asked_at: float) -> None:
        """A successful query's sum becomes the reading, unless the HPA could not read it as it is.

        The reading's timestamp is when the source was read (the oldest of its samples' reads, or
        `asked_at` for samples that do not say), and its age counts from then, not from this answer.
        """
        try:
            value = sum((sample.value for sample in samples), Decimal(0))
        except ArithmeticError:  # a signalling NaN
            value = Decimal("NaN")
        problem = unservable(value)
        if problem is not None:
            telemetry.VALUES_REFUSED.labels(series.key.metric).inc()
            # The last good value is no longer what the source says: it is not served either.
            series.reading = None
            with contextlib.suppress(KeyError):
                telemetry.SERIES_VALUE.remove(series.key.metric, series.key.namespace, series.key.selector)
            self._failed(series, f"source {series.query.metric.source} returned {value}, which {problem}")
            return
        series.reading = Reading(
            metric=series.query.metric.name,
            value=value,
            labels=series.labels,
            timestamp=min((asked_at if s.read_at is None else s.read_at for s in samples), default=asked_at),
            series=len(samples),
        )
        if series.refresh_span is not None:
            series.served_by = series.refresh_span.get_span_context()
            series.refresh_span.set_attribute(tracing.SERIES, len(samples))
        series.read_at = self._clock() - max(0.0, time.time() - series.reading.timestamp)
        series.resting = value <= 0 or value < series.activation
        series.answered = True
        series.error = None
        telemetry.LAST_REFRESH.labels(series.key.metric).set(series.reading.timestamp)
        key = series.key
        telemetry.SERIES_VALUE.labels(key.metric, key.namespace, key.selector).set(float(series.reading.value))
        for listener in list(self._listeners.get(series.key, ())):
            listener(series.reading)

    def _failed(self, series: _Series, message: str) -> None:
        if series.refresh_span is not None:
            spans.failed(series.refresh_span, message)
        series.error = message
        series.failed_at = self._clock()
        telemetry.SOURCE_ERRORS.labels(series.query.metric.source, series.key.metric).inc()
        suppressed = self._warnings.allow(series.key)
        if suppressed is not None:
            log.warning("refresh of %s failed: %s%s", series.key, message, held_back(suppressed))

    async def close(self) -> None:
        self._schedule.close()
        tasks = [s.in_flight for s in self._series.values() if s.in_flight is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for series in list(self._series.values()):
            self._drop(series)
