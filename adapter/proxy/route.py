"""A route at run time: its endpoints, its FIFO of held requests, per-endpoint admission and probing.

A request goes straight to an endpoint when nothing is queued and an endpoint has room below
`endpoint_concurrency`; otherwise it is held, in arrival order, until `pump` finds room. Requests that
could not be written anywhere (connect refused, a stale keep-alive connection) go back to the front.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from prometheus_client import Counter

from adapter.config.base import split_address
from adapter.config.route import RouteConfig, ServiceUpstream
from adapter.proxy import trace
from adapter.proxy.choices import NAVIGATION, ColdChoices
from adapter.proxy.counts import CountsBoard, RouteCounts
from adapter.proxy.exchange import ASSIGNED, QUEUED, Exchange
from adapter.proxy.refused import RefusedEndpoints
from adapter.proxy.upstream import Endpoint
from adapter.telemetry import proxy as telemetry
from adapter.telemetry import tracing

if TYPE_CHECKING:
    from opentelemetry.trace import Span

# The Service port appProtocol Kubernetes defines for HTTP/2 over cleartext with prior knowledge (KEP-3726).
H2C_APP_PROTOCOL = "kubernetes.io/h2c"

_PROBE_TIMEOUT = 1.0
_IDLE_PROBE_INTERVAL = 1.0
# Seconds a waking page keeps counting past its refresh: the browser's reload comes a little after it.
_PAGE_GRACE = 2.0


class Route:
    """One configured route at run time, between the client ends and the upstream ends. Its one job is to decide
    where each request it is given goes: straight to one of its endpoints (`Endpoint`, whose `UpstreamConnection`s
    carry it) while one has room, otherwise into its FIFO of held requests until `pump` finds room; and to tell
    its waker (`on_cold`) when a request is held while no endpoint is usable. Its held and in-flight counts are
    what the HPA scales on.

    The client end (client.py, h2client.py) finds it in the `RouteTable` the control plane installed and hands it
    each request's `Exchange` (`submit`); the exchange keeps it until the request is answered. Readiness, waking
    and the activator are the control plane's (services.py); its readiness (readiness.py) tells it its endpoints
    (`set_endpoints`).

    One version of a route: a changed route gets a new one, sharing its counts with the version it replaces
    (`board`), while the old one finishes the requests it admitted."""

    def __init__(
        self,
        config: RouteConfig,
        *,
        allow_loopback: bool = False,
        board: CountsBoard | None = None,
        name: str = "",
        sidecar: bool = False,
    ) -> None:
        self.config = config
        # How it is served, as its spans say (zeroscale.mode): a sidecar's route, an activator route, or in the path.
        self.mode = "sidecar" if sidecar else "activator" if config.mode == "activator" else "proxy"
        # The route's identity in counts, metrics and logs: `<namespace>/<name>` (`name`: a fallback's, see below).
        self.name = name or config.key
        # A loopback address may be an endpoint (proxy.allow_loopback_endpoints, or a sidecar's upstream): every other
        # rule of docs/architecture.md#only-ip-endpoints holds all the same.
        self.allow_loopback = allow_loopback
        self.refused_dns = RefusedEndpoints(self.name, "dns", f"route {self.name}: DNS")
        self.limits = config.limits
        held_only = config.mode == "activator"
        self.counts = board.counts(self.name, held_only=held_only) if board is not None else RouteCounts(self.name)
        self.queue: deque[Exchange] = deque()
        # Never-wake rules and the waking page (None: the route has neither, and pays nothing for them).
        self.choices = ColdChoices.of(config)
        # While a waking page is out (a browser will ask again): the timer that ends it, and when it ends (the loop's
        # time). Meanwhile the route counts one held request and stays cold for its waker
        # (docs/architecture.md#waking-page).
        self._page_timer: asyncio.TimerHandle | None = None
        self._page_until = 0.0
        # Called when a request is held while no endpoint is usable (the waker).
        self.on_cold: Callable[[], None] | None = None
        # When the waker last patched the scale subresource (monotonic; see wake_sent).
        self._wake_sent_at = 0.0
        # Why the waker's latest attempt failed ("": it did not), for requests whose hold times out meanwhile.
        self.wake_failure = ""
        # Why the waker's latest attempt was refused ("": it was not, or a wake went out since, or the route is warm):
        # a navigation then is held, to be told it, not shown a page promising a wake.
        self.wake_refusal = ""
        # Called after the endpoints were replaced (the waker reads the target's replicas again).
        self.on_endpoints: Callable[[], None] | None = None
        # Whether the endpoints were ever set (its slices read once): until then nothing is known of its readiness.
        self.readiness_known = False
        # Called when the route turns warm or cold, or its readiness is first known (the status writer's cue).
        self.on_warmth: Callable[[], None] | None = None
        self._warm = False
        self.stats = telemetry.HOT_PATH.stats(self.name)
        self._hold_seconds = telemetry.HOLD_SECONDS.labels(self.name)
        self._connects = {result: telemetry.UPSTREAM_CONNECTS.labels(self.name, result) for result in ("ok", "error")}
        self._endpoints: list[Endpoint] = []
        self._rr = 0
        # Requests of this version sent to an endpoint and not yet answered (the counts are the route's, all versions).
        self.assigned = 0
        # Upgraded connections open through this route (not requests: they hold no endpoint slot).
        self.tunnels = 0
        telemetry.OPEN_TUNNELS.labels(self.name).set_function(lambda: self.tunnels)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._prober: asyncio.Task[None] | None = None
        self._probe_now = asyncio.Event()
        self._probe_idle = False
        self._cold_since = 0.0
        # The span of the request held first in the cold start under way (None: none, or it was not traced): the
        # parent of its wakes' spans, and the exemplar of its wake-to-ready time.
        self._cold_span: Span | None = None
        # How long the latest cold start took (seconds; None: none yet), for the route's status.
        self.last_cold_start: float | None = None
        self._ready_at = 0.0
        self._await_first_byte = False
        self._closed = False
        # Since when (monotonic) the upstream has had no endpoint at all, and the time so spent before.
        self._zero_since = 0.0
        self._zero_seconds = 0.0
        address = getattr(config.upstream, "address", None)
        self.default_host = (address or f"{config.upstream.service}.{config.upstream.namespace}").encode()  # type: ignore[union-attr]
        telemetry.READY_ENDPOINTS.labels(self.name).set_function(self.usable_count)
        telemetry.AT_ZERO.track(self.name, self.seconds_at_zero)
        # The route's fallback Service (docs/architecture.md#fallback): a route of its own that never wakes anything,
        # with counts of its own (not on the board: what it serves is not pending for the workload); `fallback_after`
        # is read when a request is first held (0: no fallback).
        self.fallback: Route | None = None
        self.fallback_after = 0.0
        if config.fallback is not None:
            self.fallback = Route(
                fallback_config(config), allow_loopback=allow_loopback, name=fallback_name(self.name), sidecar=sidecar
            )
            self.fallback.on_warmth = self._send_past_due
            self.fallback_after = config.fallback.after

    # --- endpoints ---

    def set_endpoints(self, addresses: list[tuple[str, int]], app_protocol: str = "") -> None:
        """Replace the ready endpoints (from an EndpointSlice watch, whose port's `app_protocol` says which HTTP the
        upstream speaks when the route does not: docs/architecture.md#h2-upstreams; or the configured address)."""
        protocol = getattr(self.config.upstream, "protocol", "auto")
        h2c = protocol == "h2c" or (protocol == "auto" and app_protocol == H2C_APP_PROTOCOL)
        # An endpoint whose protocol changed is a new one (its connections speak the old protocol).
        current = {(ep.host, ep.port, ep.h2c): ep for ep in self._endpoints}
        endpoints = []
        for host, port in dict.fromkeys(addresses):
            endpoint = current.pop((host, port, h2c), None) or Endpoint(self, host, port, h2c=h2c)
            endpoints.append(endpoint)
        for gone in current.values():
            gone.removed = True
            gone.close_idle()
        self._endpoints = endpoints
        self._track_zero(bool(endpoints))
        first = not self.readiness_known
        self.readiness_known = True
        self._readiness_changed(first)
        if self.on_endpoints is not None:
            self.on_endpoints()

    def set_static_endpoint(self, address: str) -> None:
        self.set_endpoints([split_address(address)])

    @property
    def endpoints(self) -> list[Endpoint]:
        return list(self._endpoints)

    def usable_count(self) -> int:
        return sum(1 for ep in self._endpoints if ep.healthy)

    def has_usable(self) -> bool:
        return any(ep.healthy for ep in self._endpoints)

    def _pick(self) -> Endpoint | None:
        endpoints = self._endpoints
        if len(endpoints) == 1:
            only = endpoints[0]
            return only if only.healthy and only.inflight < only.cap else None
        best: Endpoint | None = None
        count = len(endpoints)
        start = self._rr = (self._rr + 1) % count if count else 0
        for offset in range(count):
            endpoint = endpoints[(start + offset) % count]
            if (
                endpoint.healthy
                and endpoint.inflight < endpoint.cap
                and (best is None or endpoint.inflight < best.inflight)
            ):
                best = endpoint
        return best

    # --- requests ---

    def answers_itself(self, exchange: Exchange) -> bool:
        """Before submit, for a request with a choice (exchange.choice is not None): whether the proxy answered it
        itself (docs/architecture.md#cold-start-choices). A never-wake rule answers always (`when: always`) or while
        no endpoint is usable (`when: cold`); a navigation gets the waking page while no endpoint is usable."""
        choice = exchange.choice
        choices = self.choices
        assert choices is not None
        assert choice is not None
        if choice == NAVIGATION:
            if self.has_usable() or self.wake_refusal:
                return False
            self._show_page(exchange, "waking_page")
            return True
        if choices.rules[choice].when == "cold" and self.has_usable():
            return False
        # Never held, never counted, never a wake: answered and done.
        self._chose(exchange, "never_wake")
        exchange.answer_here(choices.rule_answers[choice])
        return True

    def _show_page(self, exchange: Exchange, choice: str) -> None:
        """The waking page for a navigation; while no endpoint is usable the workload wakes as for a held request,
        and the route counts one held request until the page's browser asks again (`refresh` seconds and a grace),
        so a route the HPA wakes from its counts (wake: hpa) is woken by a person waiting too."""
        choices = self.choices
        assert choices is not None
        assert choices.page is not None
        self._chose(exchange, choice)
        exchange.answer_here(choices.page)
        if self.has_usable() or self._closed:
            return  # overflow of a warm route: every endpoint is busy, nothing to wake
        loop = asyncio.get_running_loop()
        self._page_until = loop.time() + choices.page_seconds + _PAGE_GRACE
        if self._page_timer is None:
            self.counts.add(1, 0)
            self._page_timer = loop.call_at(self._page_until, self._page_over)
        if not self._cold_since:
            self._cold_since = time.monotonic()
        if self.on_cold is not None:
            self.on_cold()

    def _chose(self, exchange: Exchange, choice: str) -> None:
        """A cold-start choice takes `exchange` (counted, and an event of its span)."""
        telemetry.COLD_CHOICES.labels(self.name, choice).inc()
        if exchange.span is not None:
            trace.cold_choice(exchange.span, choice)

    def _page_over(self) -> None:
        """The waking page's wait is over, unless a browser asked again meanwhile (then: until its own ends)."""
        loop = asyncio.get_running_loop()
        if loop.time() < self._page_until:
            self._page_timer = loop.call_at(self._page_until, self._page_over)
            return
        self._page_timer = None
        self.counts.add(-1, 0)

    def submit(self, exchange: Exchange) -> None:
        if not self.queue:
            endpoint = self._pick()
            if endpoint is not None:
                self._assign(exchange, endpoint)
                return
        if len(self.queue) >= self.limits.max_held_requests:
            if self.config.overflow == "fallback" and self._to_fallback(exchange, "overflow_fallback"):
                return
            if exchange.choice == NAVIGATION and self.choices is not None and self.choices.overflow_page:
                self._show_page(exchange, "overflow_waking_page")
                return
            exchange.fail(
                503,
                f"the proxy already holds {len(self.queue)} requests for this route (limits.max_held_requests)",
                retry_after=self.limits.retry_after,
            )
            return
        self._hold(exchange, front=False)

    def retry(self, exchange: Exchange) -> None:
        """Back to the front of the queue: nothing of it reached an upstream (or it may safely be re-sent). A request
        with a cold-start choice meets it again first: its endpoint may have been the last one usable (a probe route
        learns it is cold from the first refused connect)."""
        if exchange.span is not None:
            trace.retried(exchange.span)
        if exchange.choice is not None and self.answers_itself(exchange):
            return
        self._hold(exchange, front=True)
        self.pump()

    def connect_failed(self, endpoint: Endpoint, exchange: Exchange) -> None:
        endpoint.healthy = False
        endpoint.close_idle()
        self._ensure_prober()
        if exchange.state == ASSIGNED and exchange.endpoint is endpoint and exchange.upstream is None:
            self.retry(exchange)

    def leave(self, exchange: Exchange) -> None:
        """The exchange is ending (answered, failed, client gone): give back its place and its slot."""
        state = exchange.state
        if state == QUEUED:
            self._unqueue(exchange)
        elif state == ASSIGNED:
            endpoint = exchange.endpoint
            if endpoint is not None:
                endpoint.inflight -= 1
            self.assigned -= 1
            self.counts.add(0, -1)
            if self.queue:
                self.pump()

    def _unqueue(self, exchange: Exchange) -> None:
        self.queue.remove(exchange)
        self._observe_hold(exchange, time.monotonic() - exchange.held_at)
        self.counts.add(-1, 0)

    def _observe_hold(self, exchange: Exchange, seconds: float) -> None:
        """zeroscale_proxy_hold_duration_seconds, with the request's trace as its exemplar when it is traced."""
        if exchange.span is None:
            self._hold_seconds.observe(seconds)
        else:
            self._hold_seconds.observe(seconds, tracing.exemplar_of(exchange.span))

    # --- the fallback (docs/architecture.md#fallback) ---

    def hold_bound(self, exchange: Exchange) -> bool:
        """A held request reached `fallback.after` (its hold timer fired early for it): it goes to the fallback if the
        workload still has no usable endpoint and the fallback has one. False: it stays held (up to hold_timeout)."""
        if exchange.state != QUEUED or self.has_usable() or not self._fallback_usable():
            return False
        self._unqueue(exchange)
        return self._to_fallback(exchange, "fallback")

    def _fallback_usable(self) -> bool:
        return self.fallback is not None and self.fallback.has_usable()

    def _to_fallback(self, exchange: Exchange, choice: str) -> bool:
        """Hand a NEW or just unqueued exchange to the fallback route, which sends it (or holds it for room)."""
        fallback = self.fallback
        if fallback is None or not fallback.has_usable():
            return False
        self._chose(exchange, choice)
        # The fallback has no cold-start choices: there the request is one as any other (its retry meets none).
        exchange.choice = None
        exchange.to_route(fallback)
        fallback.submit(exchange)
        return True

    def why_still_held(self) -> str:
        """What a held request's 504 adds: why the workload was not woken, and that its fallback could not take it."""
        why = f"; not woken: {self.wake_failure}" if self.wake_failure else ""
        fallback = self.config.fallback
        if fallback is not None and not self._fallback_usable():
            why += f"; the fallback Service {fallback.service} has no ready endpoint either"
        return why

    def _send_past_due(self) -> None:
        """The requests held past `fallback.after` go to the fallback, if the workload has no usable endpoint and the
        fallback has one: called when the fallback gets ready, and when the workload turns cold (a request past its
        bound stayed while the workload was warm and full, or while its connect was under way)."""
        if self.has_usable() or not self._fallback_usable():
            return
        due = time.monotonic() - self.fallback_after
        for exchange in [held for held in self.queue if held.held_at <= due]:
            self._unqueue(exchange)
            self._to_fallback(exchange, "fallback")

    def pump(self) -> None:
        """Send held requests, oldest first, while some endpoint has room."""
        queue = self.queue
        while queue:
            endpoint = self._pick()
            if endpoint is None:
                return
            self._assign(queue.popleft(), endpoint)

    def _hold(self, exchange: Exchange, *, front: bool) -> None:
        usable = self.has_usable()
        first = not exchange.held_at
        left = exchange.to_queue(cold=not usable)
        if left is not None:
            left.inflight -= 1
            self.assigned -= 1
        if front:
            self.queue.appendleft(exchange)
        else:
            self.queue.append(exchange)
        self.counts.add(1, -1 if left is not None else 0)
        if not usable:
            if not self._cold_since:
                self._cold_since = time.monotonic()
                self._cold_span = exchange.span
            if self.on_cold is not None:
                self.on_cold()
        if first and exchange.span is not None:
            self._traced_hold(exchange.span, not usable)
        self._ensure_prober()
        if exchange.body:
            exchange.check_held_body()

    def _traced_hold(self, span: Span, cold: bool) -> None:
        """A traced request's first hold: when cold, also what its wake is so far (sent earlier in this cold start,
        or none coming from this route)."""
        trace.held(span, cold)
        if not cold:
            return
        if self.on_cold is None:
            wake = self.config.wake
            trace.wake_not_sent(
                span, f"wake_{wake}", f"route {self.name} has wake: {wake}: the proxy patches no target"
            )
        elif self._wake_sent_at and self._wake_sent_at >= self._cold_since:
            trace.wake_sent(span, time.monotonic() - self._wake_sent_at)

    def _assign(self, exchange: Exchange, endpoint: Endpoint) -> None:
        self.assigned += 1
        self.counts.add(-1 if exchange.state == QUEUED else 0, 1)
        endpoint.inflight += 1
        if not exchange.attempts:
            self.stats.requests += 1
        waited = exchange.to_endpoint(endpoint)
        if waited is not None:
            self._observe_hold(exchange, waited)

    # --- time at zero ---

    def _track_zero(self, any_endpoint: bool) -> None:
        now = time.monotonic()
        if any_endpoint and self._zero_since:
            self._zero_seconds += now - self._zero_since
            self._zero_since = 0.0
        elif not any_endpoint and not self._zero_since:
            self._zero_since = now

    def seconds_at_zero(self) -> float:
        running = time.monotonic() - self._zero_since if self._zero_since else 0.0
        return self._zero_seconds + running

    # --- cold starts ---

    def _readiness_changed(self, first: bool = False) -> None:
        warm = self.has_usable()
        if (warm != self._warm or first) and self.on_warmth is not None:
            self.on_warmth()
        self._warm = warm
        if warm:
            # A page's browser will be forwarded when it asks again, counted as any request: nothing waits meanwhile.
            self.forget_page()
            self.wake_refusal = ""
            if self._cold_since:
                now = time.monotonic()
                began = self._wake_sent_at if self._wake_sent_at >= self._cold_since else self._cold_since
                telemetry.COLD_STARTS.labels(self.name).inc()
                span, self._cold_span = self._cold_span, None
                if span is None:
                    telemetry.WAKE_TO_READY_SECONDS.labels(self.name).observe(now - began)
                else:
                    telemetry.WAKE_TO_READY_SECONDS.labels(self.name).observe(now - began, tracing.exemplar_of(span))
                self._traced_held(trace.endpoint_ready)
                self.last_cold_start = now - began
                self._cold_since = 0.0
                self._ready_at = now
                self._await_first_byte = True
            self.pump()
        elif self.queue and self.fallback is not None:
            self._send_past_due()

    def tunnel_opened(self) -> None:
        self.tunnels += 1

    def tunnel_closed(self) -> None:
        self.tunnels -= 1

    def first_byte(self, span: Span | None) -> None:
        """A held request's response began (`span`: its span): closes the cold start's last phase."""
        if self._await_first_byte:
            self._await_first_byte = False
            seconds = time.monotonic() - self._ready_at
            histogram = telemetry.READY_TO_FIRST_BYTE_SECONDS.labels(self.name)
            if span is None:
                histogram.observe(seconds)
            else:
                histogram.observe(seconds, tracing.exemplar_of(span))

    @property
    def idle(self) -> bool:
        """Nothing held or forwarded by this version (nor by its fallback): a retired one may be closed. (An open
        tunnel is a byte relay of its own connections, which closing the route leaves alone.)"""
        return not self.queue and not self.assigned and (self.fallback is None or self.fallback.idle)

    @property
    def cold(self) -> bool:
        """Requests are held, or a waking page is out, and no endpoint is usable: the workload needs waking."""
        return (bool(self.queue) or self._page_timer is not None) and not self.has_usable()

    # --- probing endpoints that refused connections ---

    def _ensure_prober(self) -> None:
        if self._probe_idle:
            # A prober waiting out its idle interval goes again at once: a request is waiting now.
            self._probe_now.set()
        if (self._prober is None or self._prober.done()) and not self._closed:
            self._prober = self.spawn(self._probe_loop())

    async def _probe_loop(self) -> None:
        """Re-dial endpoints that refused connections: every probe_interval while requests wait, else every second."""
        while not self._closed:
            failing = [ep for ep in self._endpoints if not ep.healthy]
            if not failing:
                return
            self._probe_now.clear()
            await asyncio.gather(*(self._probe(ep) for ep in failing))
            self._readiness_changed()
            if all(ep.healthy for ep in self._endpoints):
                return
            self._probe_idle = not self.queue
            try:
                async with asyncio.timeout(_IDLE_PROBE_INTERVAL if self._probe_idle else self.config.probe_interval):
                    await self._probe_now.wait()
            except TimeoutError:
                pass
            finally:
                self._probe_idle = False

    async def _probe(self, endpoint: Endpoint) -> None:
        connection = await endpoint.connect(min(self.limits.connect_timeout, _PROBE_TIMEOUT))
        if connection is not None:
            endpoint.healthy = True
            # The probe's connection becomes the first pooled one: the first held request skips a connect.
            endpoint.release(connection)

    # --- plumbing ---

    def spawn(self, coroutine: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def connect_counter(self, result: str) -> Counter:
        return self._connects[result]

    # --- what the waker reports (wake.WakeListener) ---

    def wake_sent(self) -> None:
        self._wake_sent_at = time.monotonic()
        self.wake_refusal = ""
        self._traced_held(trace.wake_sent)

    def wake_failed(self, message: str, reason: str = "") -> None:
        self.wake_failure = message
        if message:
            self._traced_held(lambda span: trace.wake_not_sent(span, reason, message))

    def wake_refused(self, message: str, reason: str) -> None:
        self._traced_held(lambda span: trace.wake_not_sent(span, reason, message))
        self.wake_refusal = message
        self.forget_page()  # no wake is coming: the page's count would keep the waker asking for nothing
        self.fail_held(503, message)

    def wake_parent(self) -> Span | None:
        """The span a wake's span is a child of: the request held first in this cold start."""
        return self._cold_span

    def _traced_held(self, event: Callable[[Span], None]) -> None:
        """Add `event` to the span of every request held now (nothing when tracing is off)."""
        if tracing.TRACER is None:
            return
        for exchange in self.queue:
            if exchange.span is not None:
                event(exchange.span)

    def fail_held(self, code: int, message: str) -> None:
        for exchange in list(self.queue):
            exchange.fail(code, message, retry_after=self.limits.retry_after)

    def forget_page(self) -> None:
        """No reload of a waking page is awaited any more (the workload is ready, the proxy is shutting down, the
        route closing): the count it kept goes now."""
        timer, self._page_timer = self._page_timer, None
        if timer is not None:
            timer.cancel()
            self.counts.add(-1, 0)

    async def close(self) -> None:
        if self.fallback is not None:
            await self.fallback.close()
        self._closed = True
        self.forget_page()
        for endpoint in self._endpoints:
            endpoint.close_idle()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def fallback_name(route: str) -> str:
    """The fallback's name in metrics and logs: `<namespace>/<name>/fallback` (no route's name has a `/`)."""
    return f"{route}/fallback"


def fallback_config(config: RouteConfig) -> RouteConfig:
    """The route the fallback Service is served as: the route's limits and readiness, the Service in the route's own
    namespace (`home`: a fallback never names another), no waking and no cold-start options of its own."""
    fallback = config.fallback
    assert fallback is not None
    return RouteConfig(
        name=config.name,
        namespace=config.home,
        upstream=ServiceUpstream(
            service=fallback.service, namespace=config.home, port=fallback.port, protocol=fallback.protocol
        ),
        wake="none",
        readiness=config.readiness,
        probe_interval=config.probe_interval,
        limits=config.limits,
    )
