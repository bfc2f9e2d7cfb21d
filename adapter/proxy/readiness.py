"""Where a route's ready endpoints come from: an EndpointSlice watch, or the configured address (connect probes).

The watch keeps the last known endpoints while the API is unreachable (no fabricated "none ready");
a 401/403 with `readiness: auto` switches the route to connect probes for good.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from adapter.config.route import AddressUpstream, ServiceRef, ServiceUpstream
from adapter.kube.client import KubeClient
from adapter.kube.endpointslices import app_protocol, list_slices, ready_addresses, refused_addresses
from adapter.kube.errors import KubeAPIError, KubeError
from adapter.kube.watching import Lister
from adapter.proxy.refused import RefusedEndpoints
from adapter.proxy.route import Route
from adapter.proxy.slices import SliceSubscription, SliceWatches

log = logging.getLogger(__name__)


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


def read_endpoint_slices(
    slices: SliceWatches,
    route: Route,
    upstream: ServiceUpstream,
    *,
    fallback: bool,
    also: Callable[[dict[str, dict[str, Any]]], None] | None = None,
) -> SliceSubscription:
    """Keeps `route`'s endpoints to what the upstream Service's slices say may take traffic; `also` is given the
    slices after each change too (an activator route copies them into its Service's slices)."""

    refused = RefusedEndpoints(
        route.name, "endpointslice", f"route {route.name}: the EndpointSlices of Service {upstream.service}"
    )

    def changed(service_slices: dict[str, dict[str, Any]]) -> None:
        refused.report(refused_addresses(service_slices.values(), loopback=route.allow_loopback))
        route.set_endpoints(
            ready_addresses(service_slices.values(), upstream.port, loopback=route.allow_loopback),
            app_protocol(service_slices.values(), upstream.port),
        )
        if also is not None:
            also(service_slices)

    def failed(err: KubeError) -> bool:
        if isinstance(err, KubeAPIError) and err.status in (401, 403) and fallback:
            _fall_back(route, upstream, err)
            return True
        log.warning("route %s: EndpointSlice watch failed: %s", route.name, err)
        return False

    return slices.read(upstream.namespace, upstream.service, changed, failed)


def slice_lister(kube: KubeClient, upstream: ServiceRef) -> Lister:
    """Lists a Service's slices (discovery.k8s.io/v1, else v1beta1)."""
    return functools.partial(list_slices, kube, upstream.namespace, upstream.service)


def _fall_back(route: Route, upstream: ServiceUpstream, err: KubeAPIError) -> None:
    try:
        address = probe_address(upstream)
    except ValueError as problem:
        log.error("route %s: EndpointSlices refused (%s) and %s", route.name, err, problem)
        return
    log.warning(
        "route %s: EndpointSlices refused (%s); readiness falls back to connect probes of %s", route.name, err, address
    )
    route.set_static_endpoint(address)
