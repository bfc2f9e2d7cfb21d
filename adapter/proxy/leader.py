"""One writer at a time: leader election on a Lease, the way Kubernetes' own components do it
(docs/protocols.md#leases).

Every `retry_period` each replica reads the Lease. A replica that does not hold it takes it only when it is free
(no holder) or when its record (holder and resourceVersion) has not changed for `lease_duration` as timed on this
replica's own clock: no two clocks are compared. The holder renews every `retry_period`; one that has not
renewed within `renew_deadline` of its last renewal's start stops leading then (`leading` is read against the
clock, not left to the next try, which a slow API may put off), before anyone may take over, so the routes' slices have
at most one writer; and one that reads the Lease held by someone else (taken, or deleted and created again by
another replica) stops at once rather than at its renew_deadline. The Lease is ours only when it names our
identity and this process (leases.INSTANCE_ANNOTATION): two replicas may share an identity. On shutdown the holder
gives the Lease up, so another replica takes over within a `retry_period` instead of a `lease_duration`.

The holder says on the Lease which routes it writes (leases.ROUTES_ANNOTATION); a replica that does not hold it
compares them with its own at every read, and says so (log, zeroscale_proxy_activator_holder_serves) when the holder
does not write some of its routes, or writes them from another config: two installations sharing one Lease, or a
rollout changing the routes (docs/architecture.md#activator).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import secrets
import socket
import time
from collections.abc import Callable

from adapter.config.proxy import ActivatorConfig
from adapter.kube.client import KubeClient
from adapter.kube.errors import KubeAPIError, KubeError
from adapter.kube.leases import Lease, get_lease, unserved, write_lease
from adapter.kube.watching import WatchTask
from adapter.telemetry import proxy as telemetry

log = logging.getLogger(__name__)


class LeaderElector(WatchTask):
    def __init__(self, kube: KubeClient, config: ActivatorConfig, routes: dict[str, str] | None = None) -> None:
        """`routes`: what this replica's activator routes write, by name (ProxyConfig.activator_routes)."""
        self._kube = kube
        self._config = config
        self._routes = routes or {}
        self._unserved_logged: tuple[str, str | None] = ("", None)  # the holder and what it did not write
        self.identity = config.identity or socket.gethostname()
        self.instance = secrets.token_hex(8)  # this process, whatever its identity
        self.watch_name = f"activator lease {config.lease_namespace}/{config.lease()}"
        self._leading = False  # as last told to the listeners; `leading` also ends at the renew deadline
        self._listeners: list[Callable[[bool], None]] = []
        self._lease: Lease | None = None
        self._seen: tuple[str, str] | None = None  # the record last read, and when it last changed (our clock)
        self._seen_at = 0.0
        self._renewed_at = -math.inf
        self._failure_logged: str | None = None
        telemetry.ACTIVATOR_LEADER.set_function(lambda: int(self.leading))

    @property
    def leading(self) -> bool:
        """This replica may write: it holds the Lease, renewed less than renew_deadline ago."""
        return self.write_time_left() > 0

    def write_time_left(self) -> float:
        """Seconds a write sent now has to land, while this replica may still be the only writer; <= 0: none.

        Another replica may take the Lease lease_duration after our last renewal's start at the earliest (it times
        the record from when it read it changed, which is later). A write is bounded by renew_deadline from that
        start instead: the rest, lease_duration - renew_deadline, is the margin for the API server, which counts
        the request's own deadline from when it receives it, and for two clocks running at different rates
        (docs/architecture.md#activator)."""
        if not self._leading:
            return 0.0
        return self._renewed_at + self._config.renew_deadline - time.monotonic()

    def subscribe(self, listener: Callable[[bool], None]) -> Callable[[], None]:
        """Call `listener(leading)` whenever this replica starts or stops leading; returns what unsubscribes it."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    def set_routes(self, routes: dict[str, str]) -> None:
        """What this replica's activator routes write now (route objects come and go): said on the next renewal."""
        for gone in self._routes.keys() - routes.keys():
            telemetry.ACTIVATOR_HOLDER_SERVES.remove(gone)
        self._routes = routes

    async def _run(self) -> None:
        while True:
            # A renewal counts from before it was sent: the API wrote it later, and others time it from then.
            started = time.monotonic()
            renewed = await self._try_once()
            if self._leading and not self.leading:
                log.warning("%s: not renewed within renew_deadline; stopping writing", self.watch_name)
                self._set_leading(False)  # told before leading again, so listeners read what was written meanwhile
            if renewed:
                self._renewed_at = started
                self._set_leading(True)
            await asyncio.sleep(self._config.retry_period)

    async def _try_once(self) -> bool:
        """Take or renew the Lease; True when this replica holds it, renewed now."""
        config = self._config
        try:
            async with asyncio.timeout(config.retry_period):
                lease = await get_lease(self._kube, config.lease_namespace, config.lease())
                # The record was current at most now (an answer may be slow): the lease_duration is timed from here.
                now = time.monotonic()
                if lease is not None:
                    if lease.record() != self._seen:
                        self._seen, self._seen_at = lease.record(), now
                    ours = lease.holder == self.identity and lease.instance == self.instance
                    self._compare(None if ours else lease)
                    if lease.holder and not ours:
                        self._set_leading(False)  # someone else holds it: it may be writing now
                        if now - self._seen_at < lease.duration_seconds:
                            return False
                self._lease = await write_lease(
                    self._kube,
                    config.lease_namespace,
                    config.lease(),
                    self.identity,
                    self.instance,
                    math.ceil(config.lease_duration),
                    lease,
                    frozenset(self._routes.values()),
                )
        except KubeAPIError as err:
            if err.status == 409:  # someone else wrote it since we read it: they may hold it now
                self._set_leading(False)
            else:
                self._log_failure(str(err))
            return False
        except (KubeError, TimeoutError) as err:
            self._log_failure(str(err) or "no answer within retry_period")
            return False
        self._seen, self._seen_at, self._failure_logged = self._lease.record(), now, None
        self._compare(None)  # ours: this replica writes its own routes
        return True

    def _compare(self, other: Lease | None) -> None:
        """Whether the Lease's holder writes this replica's routes as its config says (`other`: the Lease as read,
        held by another or by nobody; None: this replica holds it); said once per distinct finding and holder."""
        if other is not None and other.holder and other.routes is None:
            # The holder does not say: unknown, not a fabricated 0 or 1.
            for route in self._routes:
                with contextlib.suppress(KeyError):
                    telemetry.ACTIVATOR_HOLDER_SERVES.remove(route)
            if self._routes and self._unserved_logged != (other.holder, "unknown"):
                self._unserved_logged = (other.holder, "unknown")
                log.info(
                    "%s: the holder %s does not say which routes it writes (an older version of the proxy, during a "
                    "rollout, or another program): whether it writes this replica's is unknown until it does",
                    self.watch_name,
                    other.holder,
                )
            return
        if other is None:
            missing = {}
        elif not other.holder:  # given up, or never taken: nobody writes them until a replica takes it
            missing = dict.fromkeys(self._routes, "not written")
        else:
            missing = unserved(self._routes, other.routes or frozenset())
        for route in self._routes:
            telemetry.ACTIVATOR_HOLDER_SERVES.labels(route).set(int(route not in missing))
        found = [f"{route} ({how})" for route, how in sorted(missing.items())]
        finding = ", ".join(found) or None
        holder = other.holder if other is not None else ""
        if (holder, finding) != self._unserved_logged:
            self._unserved_logged = (holder, finding)
            # Nobody holding it is not a finding of its own: a replica takes it at its next try, or says why not.
            if finding is not None and holder:
                log.warning(
                    "%s: the holder %s does not write routes of this replica: %s. Their Services get no slices, or "
                    "slices decided by another config: two installations share this Lease (give each its own "
                    "proxy.activator.lease_name; by default it follows proxy_service), or the holder runs another "
                    "version of the routes (a rollout: it ends when the holder is replaced)",
                    self.watch_name,
                    holder,
                    finding,
                )

    def _log_failure(self, why: str) -> None:
        if why != self._failure_logged:  # once per distinct failure, not every retry_period
            self._failure_logged = why
            lease = self._config.lease()
            hint = (
                f" (grant create on leases, and get and update on Lease {lease}, in that namespace)"
                if "403" in why
                else ""
            )
            log.warning("%s: cannot read or write the Lease: %s%s", self.watch_name, why, hint)

    def _set_leading(self, leading: bool) -> None:
        if leading != self._leading:
            self._leading = leading
            log.info("%s: %s", self.watch_name, f"{self.identity} writes" if leading else "not writing")
            for listener in list(self._listeners):
                listener(leading)

    async def close(self) -> None:
        """Stop, and give the Lease up if this replica holds it."""
        await super().close()
        if not self._leading or self._lease is None:  # past renew_deadline too: the update is conditional
            return
        self._set_leading(False)
        config = self._config
        try:
            async with asyncio.timeout(config.retry_period):
                await write_lease(self._kube, config.lease_namespace, config.lease(), "", self.instance, 1, self._lease)
        except (KubeError, TimeoutError) as err:
            log.warning("%s: could not give the Lease up (it expires by itself): %s", self.watch_name, err)
