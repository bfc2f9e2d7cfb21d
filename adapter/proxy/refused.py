"""Endpoint addresses refused (docs/architecture.md#only-ip-endpoints): said once each in the log and the metric,
when it first shows up, not at every change or connect while it stays."""

from __future__ import annotations

import logging

from adapter.telemetry import proxy as telemetry

log = logging.getLogger(__name__)
_WHAT_TO_DO = {
    "loopback": "a loopback address is the proxy's own pod, never an upstream (proxy.allow_loopback_endpoints: "
    "development only)",
    "fqdn_slice": "kube-proxy routes IPv4 and IPv6 slices only: list the pods' IP addresses",
}


class RefusedEndpoints:
    """The addresses one source of a route's endpoints had refused last time, to report the new ones."""

    def __init__(self, route: str, source: str, what: str) -> None:
        """`what`: the source in words, for the log (`route web: the EndpointSlices of Service web-pods`)."""
        self._route, self._source, self._what = route, source, what
        self._seen: set[tuple[str, str]] = set()

    def report(self, refused: set[tuple[str, str]]) -> None:
        """`refused`: (address, why) of what this source gives now."""
        for address, why in sorted(refused - self._seen):
            telemetry.REFUSED_ENDPOINTS.labels(self._route, self._source, why).inc()
            hint = _WHAT_TO_DO.get(why, "the Kubernetes API refuses it as an endpoint too")
            log.warning("%s gives %r as an endpoint: refused (%s; %s)", self._what, address, why, hint)
        self._seen = refused
