"""Where a route's ready endpoints come from: an EndpointSlice watch, or the configured address (connect probes).

The watch keeps the last known endpoints while the API is unreachable (no fabricated "none ready");
a 401/403 with `readiness: auto` switches the route to connect probes for good.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from adapter.config.proxy import AddressUpstream, ServiceUpstream
from adapter.kube.client import KubeClient
from adapter.kube.endpointslices import list_slices, ready_addresses, watch_slices
from adapter.kube.errors import KubeAPIError, KubeError
from adapter.kube.watching import WatchTask, apply_event
from adapter.proxy.route import Route

log = logging.getLogger(__name__)
_BACKOFF_START, _BACKOFF_MAX = 0.5, 30.0


def probe_address(upstream: ServiceUpstream | AddressUpstream) -> str:
    """The `host:port` connect probes dial (and requests go to) without EndpointSlices."""
    if isinstance(upstream, AddressUpstream):
        return upstream.address
    if upstream.address:
        return upstream.address
    if isinstance(upstream.port, int):
        return f"{upstream.service}.{upstream.namespace}.svc:{upstream.port}"
    raise ValueError(
        f"upstream service {upstream.service}: connect probes need `address` (host:port) when `port` is a name"
    )


class EndpointSliceWatcher(WatchTask):
    def __init__(self, kube: KubeClient, route: Route, upstream: ServiceUpstream, *, fallback: bool) -> None:
        self._kube = kube
        self._route = route
        self._upstream = upstream
        self._fallback = fallback
        self.watch_name = f"EndpointSlice watch of route {route.name}"

    async def _run(self) -> None:
        upstream = self._upstream
        backoff = _BACKOFF_START
        while True:
            try:
                path, slices, version = await list_slices(self._kube, upstream.namespace, upstream.service)
                self._apply(slices)
                async for event in watch_slices(self._kube, path, version):
                    if apply_event(slices, event):
                        self._apply(slices)
                backoff = _BACKOFF_START
                continue
            except KubeAPIError as err:
                if err.status == 410:
                    continue  # our resourceVersion is too old: list again at once
                if err.status in (401, 403) and self._fallback:
                    self._fall_back(err)
                    return
                log.warning("route %s: EndpointSlice watch failed: %s", self._route.name, err)
            except KubeError as err:
                log.warning("route %s: EndpointSlice watch failed: %s", self._route.name, err)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, _BACKOFF_MAX)

    def _apply(self, slices: dict[str, dict[str, Any]]) -> None:
        self._route.set_endpoints(ready_addresses(slices.values(), self._upstream.port))

    def _fall_back(self, err: KubeAPIError) -> None:
        try:
            address = probe_address(self._upstream)
        except ValueError as problem:
            log.error("route %s: EndpointSlices refused (%s) and %s", self._route.name, err, problem)
            return
        log.warning(
            "route %s: EndpointSlices refused (%s); readiness falls back to connect probes of %s",
            self._route.name,
            err,
            address,
        )
        self._route.set_static_endpoint(address)
