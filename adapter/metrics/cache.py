"""The series cache: background refresh, one shared query per cold read, staleness, a size bound.

A series (metric, namespace, selector) is born on its first read, refreshed in the
background every `interval` for as long as someone reads it, and dropped after `idle_ttl`
without reads. A failed refresh keeps the last good value until it is older than
`max_staleness`; after that the read fails with 503. No path produces a zero that the
source did not report (DESIGN rule 1), nor a value the HPA would misread (a Quantity whose
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

from adapter.config.server import CacheConfig
from adapter.metrics.catalogue import Catalogue, SeriesKey
from adapter.metrics.errors import MetricUnavailable
from adapter.metrics.quantity import unservable
from adapter.sources.base import Sample, Source, SourceError, SourceQuery
from adapter.telemetry import cache as telemetry
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
        self.last_access = 0.0
        self.in_flight: asyncio.Task[None] | None = None
        self.loop_task: asyncio.Task[None] | None = None
        self.wake = asyncio.Event()
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
        for source in sources.values():
            source.set_change_listener(self._on_change)

    @property
    def catalogue(self) -> Catalogue:
        return self._catalogue

    def subscribe(self, key: SeriesKey, listener: ReadingListener) -> Callable[[], None]:
        """Call `listener` after every successful refresh of the series `key`; returns the unsubscribe function.

        For pushing changes (KEDA's StreamIsActive) without polling. The listener runs on the event loop
        inside the refresh: it must only record the reading, never block or raise. A subscription does
        not keep the series warm; reading it does.
        """
        listeners = self._listeners.setdefault(key, [])
        listeners.append(listener)

        def unsubscribe() -> None:
            listeners.remove(listener)
            if not listeners and self._listeners.get(key) is listeners:
                del self._listeners[key]

        return unsubscribe

    def series_count(self) -> int:
        return len(self._series)

    async def read(self, name: str, namespace: str, selector: str) -> Reading:
        """The current value of a series; raises MetricError (404, 400 or 503)."""
        request = (name.lower(), namespace, selector)
        series = self._by_request.get(request)
        if series is None:
            key, query = self._catalogue.resolve(name, namespace, selector)
            series = self._series.get(key) or self._create(key, query)
            self._remember(request, series)
        now = self._clock()
        series.last_access = now
        if not series.fresh(now):
            recently_failed = series.error is not None and now - series.failed_at < series.interval
            if series.in_flight is not None or not recently_failed:
                await asyncio.shield(self._refresh(series))
            if not series.fresh(self._clock()):
                raise self._unavailable(series)
        assert series.reading is not None
        telemetry.VALUE_AGE_SECONDS.labels(series.key.metric).observe(self._clock() - series.read_at)
        return series.reading

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
        series.loop_task = asyncio.create_task(self._keep_warm(series), name=f"series {key}")
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
        series.source.unwatch(series.query)

    def _on_change(self, query: SourceQuery) -> None:
        series = self._by_query.get(query)
        if series is not None:
            series.wake.set()

    async def _keep_warm(self, series: _Series) -> None:
        try:
            while True:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(series.wake.wait(), series.interval)
                series.wake.clear()
                if self._clock() - series.last_access > self._config.idle_ttl:
                    self._drop(series)
                    return
                if not series.answered and series.error is not None:
                    # Never answered and failed: no background queries for it. A read recreates it (one
                    # query per read at most, and none within `interval` of the failure, see read()).
                    self._drop(series)
                    return
                await self._refresh(series)
        except asyncio.CancelledError:
            raise
        except Exception:  # a bug here must not leave a series without refreshes unnoticed
            log.exception("refresh loop of %s stopped", series.key)
            self._drop(series)

    def _refresh(self, series: _Series) -> asyncio.Task[None]:
        """Start a refresh, or join the one in flight (singleflight)."""
        if series.in_flight is None:
            series.in_flight = asyncio.create_task(self._query(series))
            series.in_flight.add_done_callback(lambda _: setattr(series, "in_flight", None))
        return series.in_flight

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
        )
        series.read_at = self._clock() - max(0.0, time.time() - series.reading.timestamp)
        series.answered = True
        series.error = None
        telemetry.LAST_REFRESH.labels(series.key.metric).set(series.reading.timestamp)
        key = series.key
        telemetry.SERIES_VALUE.labels(key.metric, key.namespace, key.selector).set(float(series.reading.value))
        for listener in list(self._listeners.get(series.key, ())):
            listener(series.reading)

    def _failed(self, series: _Series, message: str) -> None:
        series.error = message
        series.failed_at = self._clock()
        telemetry.SOURCE_ERRORS.labels(series.query.metric.source, series.key.metric).inc()
        suppressed = self._warnings.allow(series.key)
        if suppressed is not None:
            log.warning("refresh of %s failed: %s%s", series.key, message, held_back(suppressed))

    async def close(self) -> None:
        tasks = [t for s in self._series.values() for t in (s.loop_task, s.in_flight) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for series in list(self._series.values()):
            self._drop(series)
