"""The one small interface every queue system implements.

A source is built from its connection settings (one per entry under `sources:`),
answers `query()` for one series at a time and is closed once at shutdown. Batching
(one pipeline or one request per interval for many series) happens inside a source,
behind this interface, so the cache never needs to know about it.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from adapter.config.base import MetricBase
    from adapter.k8s_wire.selector import Selector


class SourceError(Exception):
    """A source could not produce a value. The message names the cause for the HPA's events.

    Every failure is one of these: the cache turns it into "serve the last good value
    while fresh, then 503", never into a zero.
    """


@dataclass(frozen=True)
class Sample:
    """One number read from a source. The value served to the HPA is the sum of a query's samples.

    `read_at` is the wall-clock time the source was asked, for a source that answers from a read
    made before the query (a read shared between series); everything acknowledged before it is in
    the value. None means "read during this query": the cache stamps the time the query started.
    The value's timestamp is the oldest of its samples'.
    """

    value: Decimal
    labels: Mapping[str, str] = field(default_factory=dict)
    read_at: float | None = None


@dataclass(frozen=True, eq=False)
class SourceQuery:
    """What to read: a metric definition plus the parameters the HPA's selector supplied, for a namespace.

    `params` holds, per selector label the metric declares, the values given with `=`,
    `==` or `in` (already checked against the metric's allowed patterns). `selector`
    is the whole parsed selector, for sources that filter labelled series with it.
    `namespace` is the one asking (the HPA's request path, the ScaledObject's): a source
    whose series belong to namespaces (the `http` source's routes) reads only its own.
    Compared by identity: the cache passes the same object to `watch`, `query` and
    `unwatch`, and a source hands that object back to `changed`.
    """

    metric: MetricBase
    params: Mapping[str, tuple[str, ...]]
    selector: Selector
    namespace: str


# Called by a source when a series it serves may have changed (a pushed event).
ChangeListener = Callable[[SourceQuery], None]


class Source(abc.ABC):
    """A connection to one queue system, shared by every metric that names it."""

    def __init__(self) -> None:
        self._change_listener: ChangeListener | None = None

    @abc.abstractmethod
    async def query(self, query: SourceQuery) -> list[Sample]:
        """Read the current value of one series; raise SourceError on any failure."""

    async def close(self) -> None:  # noqa: B027 - sources without resources need no close
        """Release connections. Called once, at shutdown."""

    async def check(self) -> None:  # noqa: B027 - a source that has nothing to connect to is fine
        """Connect once and raise SourceError if that fails (used by `zeroscale check`)."""

    # Optional push of changes: the cache says which series it keeps warm, and a source
    # that can learn of changes early (keyspace notifications, proxy streams) calls back.
    def set_change_listener(self, listener: ChangeListener) -> None:
        self._change_listener = listener

    def watch(self, query: SourceQuery) -> None:  # noqa: B027 - polling sources ignore this
        """Follow this query's changes (call `changed` for them): its series was created, or asked for or
        subscribed to after an `unwatch`."""

    def unwatch(self, query: SourceQuery) -> None:  # noqa: B027 - polling sources ignore this
        """Stop following this query's changes, until the next `watch`. The cache calls it when it drops the
        series (`cache.idle_ttl` without asks, or a read failed before any answered) and also for a live series
        nobody is around for: not subscribed, and `cache.unwatch_after` passed since its latest ask (more
        while its asks have a period and the next is not half an `interval` late; MetricCache._unwatch_at).
        Such a series stays in the cache: its next ask or subscription calls `watch` with the same query
        object before querying it again."""

    def changed(self, query: SourceQuery) -> None:
        if self._change_listener is not None:
            self._change_listener(query)
