"""A route: which requests it takes (hosts, path prefix), where they go (upstream), what it wakes (target), how
(mode, wake policy) and within which limits. One model for both places a route is declared: the proxy's config
file (`RouteConfig`) and a ZeroscaleRoute object in a team's namespace (adapter/config/route_object.py, whose CRD
schema is generated from these models), so the two never drift apart.

The field docstrings are the descriptions `kubectl explain zeroscaleroute.spec` shows and the Helm schema carries.
"""

from __future__ import annotations

import re
from functools import cached_property
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from adapter.config.base import Duration, Strict, split_address
from adapter.config.cold import (
    MAX_HEADERS,
    Fallback,
    NeverWakeRule,
    Overflow,
    WakingPage,
    WakingPageWithFile,
    lowered_headers,
)

LABEL_VALUE_MAX = 63  # a Kubernetes label value
# Headers a condition could name that an HTTP/1.1 request and the same request over HTTP/2 carry differently, so the
# two ends (and the dry run) would route it differently (docs/architecture.md#route-precedence).
# The words of also_wake's check, shared with its CEL rule (scripts/crd/generate.py).
ALSO_WAKE_ONCE = "also_wake names each workload once, and not the route's target"
# A host as a route claims it, after lowering (the CRD checks the same with CEL, scripts/crd/generate.py): DNS
# labels joined by dots, without a trailing dot (a request's Host is compared without one, so `shop.example.` would be
# a claim of its own that no request ever matches), after `*.` or alone as `*`.
_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS_LABEL = rf"^{_LABEL}$"
HOST_PATTERN = re.compile(rf"^(\*|(\*\.)?{_LABEL}(\.{_LABEL})*)$")


class RouteLimits(Strict):
    """What one route may hold and how long it waits; every bound answers with its own status."""

    max_held_requests: int = Field(default=1000, ge=1)
    """Held (queued) requests; one more is answered 503 with Retry-After."""
    max_held_bytes: int = Field(default=64 * 1024 * 1024, ge=0)
    """Request bodies buffered while not yet connected upstream, summed over the route (503 beyond)."""
    max_held_body_bytes: int = Field(default=1024 * 1024, ge=0)
    """One request's body buffered while held (413 beyond)."""
    hold_timeout: Duration = 120.0
    """How long a request waits for a ready endpoint (504 beyond)."""
    connect_timeout: Duration = 5.0
    """How long dialling an endpoint may take; one that does not connect in time is marked unhealthy, probed again,
    and the request goes to another endpoint or waits in the queue."""
    body_timeout: Duration = Field(default=60.0, gt=0)
    """From the request's head to its body's last byte: the whole body must arrive within this (408 beyond). Raise
    it on a route that takes large uploads from slow clients."""
    response_timeout: Duration = 60.0
    """From the request's last byte sent to the response head, and then the longest silence within the response body
    while the client keeps reading (504 before the head; the response is cut off after)."""
    endpoint_concurrency: int = Field(default=256, ge=1)
    """Concurrent requests per endpoint; more wait in the queue, so a burst spreads over pods as they come up."""
    max_idle_connections: int = Field(default=128, ge=0)
    """Idle keep-alive connections kept per endpoint."""
    retry_after: int = Field(default=5, ge=0)
    """Seconds the Retry-After header of this route's 503 answers asks clients to wait (a full queue, too many held
    bytes, a refused wake)."""
    max_response_head_bytes: int = Field(default=64 * 1024, ge=1024)
    """An upstream's response head (interim answers included): larger is a 502 (httptools buffers it until it ends)."""
    max_tunnels: int = Field(default=1000, ge=1)
    """Open upgraded (WebSocket) tunnels; one more upgrade request is answered 503 with Retry-After."""
    tunnel_idle_timeout: Duration = Field(default=300.0, gt=0)
    """A tunnel with no byte in either direction for this long is closed."""


UpstreamProtocol = Literal["auto", "http1", "h2c"]


class ServiceRef(Strict):
    """A Kubernetes Service by name: its pods' addresses are read from its EndpointSlices."""

    service: str = Field(pattern=DNS_LABEL)
    """The Service's name."""
    namespace: str = Field(pattern=DNS_LABEL)
    """The Service's namespace."""


class ServiceUpstream(ServiceRef):
    """A Kubernetes Service: endpoints come from its EndpointSlices; `address` is used by the probe fallback."""

    port: str | int = ""
    """The Service port's name (matched against EndpointSlice `ports[].name`) or its number."""
    address: str | None = None
    """Where the connect probe dials without API access, e.g. `web.default.svc:80`."""
    protocol: UpstreamProtocol = "auto"
    """The HTTP the upstream speaks: http1, h2c (HTTP/2 over cleartext with prior knowledge: gRPC servers), or
    auto: h2c when the Service port's appProtocol is `kubernetes.io/h2c`, else HTTP/1.1."""

    @field_validator("address")
    @classmethod
    def _address(cls, value: str | None) -> str | None:
        if value is not None:
            split_address(value)
        return value


class AddressUpstream(Strict):
    """A fixed `host:port`; readiness comes from connect probes."""

    address: str
    """The upstream's `host:port` (`[v6]:port` for IPv6)."""
    protocol: UpstreamProtocol = "auto"
    """The HTTP the upstream speaks: http1, h2c (HTTP/2 over cleartext with prior knowledge: gRPC servers); auto
    is http1 for an address (there is no Service port to read an appProtocol from)."""

    @field_validator("address")
    @classmethod
    def _address(cls, value: str) -> str:
        split_address(value)
        return value


class ScaleTarget(Strict):
    """The workload whose scale subresource is patched to wake it (docs/protocols.md#scale-subresource)."""

    namespace: str = Field(pattern=DNS_LABEL)
    """The workload's namespace."""
    kind: Literal["Deployment", "StatefulSet", "ReplicaSet"] = "Deployment"
    """The workload's kind."""
    name: str = Field(pattern=DNS_LABEL)
    """The workload's name."""


class LocalScaleTarget(Strict):
    """Development mode only (`zeroscale demo`): a workload of local processes, not a Kubernetes object.

    `url` is a loopback HTTP server (the demo's local scaler) that answers the scale subresource's
    GET and merge-PATCH for `name` exactly as the Kubernetes API would, so waking it is the same
    code path as waking a Deployment. Never use it in a cluster.
    """

    kind: Literal["Local"]
    """`Local`: a workload of local processes (`zeroscale demo`)."""
    name: str = Field(pattern=DNS_LABEL)
    """The local workload's name, as the local scaler knows it."""
    url: str
    """The local scaler's loopback address, `http://127.0.0.1:PORT`."""

    @field_validator("url")
    @classmethod
    def _loopback(cls, url: str) -> str:
        parts = urlsplit(url)
        if parts.scheme != "http" or parts.hostname not in ("127.0.0.1", "::1", "localhost") or parts.port is None:
            raise ValueError("a Local target's url is http://127.0.0.1:PORT (loopback only: a development mode)")
        return url


class ActivatorRoute(Strict):
    """A `mode: activator` route's Service: clients call it; Zeroscale writes its EndpointSlices (the pods while
    the workload has a ready one, the proxy's pods while it has none). docs/architecture.md#activator."""

    service: str = Field(pattern=DNS_LABEL, max_length=63)
    """The selector-less Service clients call, in the upstream's namespace. Its slices are Zeroscale's to write; the
    route's `upstream` is the second Service, the one that selects the workload's pods."""
    port: int = Field(ge=1, le=65535)
    """The proxy's listener for this route alone: while the workload is cold, the Service's slice lists the proxy's
    pods on this port, and every request arriving on it belongs to this route whatever its Host."""
    port_name: str | None = Field(default=None, max_length=63, pattern=rf"^({_LABEL})?$")
    """The Service port's name the written slices carry (kube-proxy matches slice ports to Service ports by name);
    by default the upstream's port when it is a name, else "" (a Service with one unnamed port)."""
    max_endpoints_per_slice: int = Field(default=100, ge=1, le=1000)
    """Endpoints per written slice (the API allows 1000; Kubernetes' own controller writes 100)."""


class RouteFields(Strict):
    """What a route in the config file and a ZeroscaleRoute's spec share: which requests it takes and how it wakes."""

    hosts: list[str] = Field(default_factory=lambda: ["*"], min_length=1, max_length=64)
    """Exact host names or `*.suffix` wildcards (matched case-insensitively, port ignored); `*` matches any host.
    Across namespaces a host belongs to its oldest claim (docs/architecture.md#host-claims)."""
    path_prefix: str = Field(default="/", max_length=1024)
    """Requests whose path starts with this (at a `/` boundary) are this route's; the longest prefix wins."""
    mode: Literal["in_path", "activator"] = "in_path"
    """in_path: every request goes through the proxy. activator: the proxy is in the path only while the workload
    has no ready pod; `activator` names the Service whose EndpointSlices Zeroscale writes."""
    activator: ActivatorRoute | None = None
    """mode activator only: the Service clients call and the proxy's listener for it."""
    wake: Literal["scale", "always", "hpa", "none"] = "scale"
    """scale: patch the scale subresource while it is 0, if the target's HPA scaled it there itself (ScaledToZero,
    Kubernetes v1.37+); always: whenever it is 0; hpa: only report counts (the HPA wakes it); none: neither."""
    wake_without_hpa: bool = True
    """wake: scale, for a target no HPA scales: wake it (true) or answer 503 as for one stopped by hand (false)."""
    wake_replicas: int = Field(default=1, ge=1, le=1000)
    """The replicas a wake sets when the target reads 0."""
    wake_retry_interval: Duration = Field(default=5.0, gt=0)
    """While requests are held and the target still reads 0, wake again this often."""
    probe_interval: Duration = Field(default=0.01, gt=0)
    """How often an endpoint that refused a connection is dialled again while requests wait (else every second)."""
    limits: RouteLimits = Field(default_factory=RouteLimits)
    """What the route may hold and how long each phase of a request may take."""
    match_headers: dict[str, str] = Field(default_factory=dict, max_length=MAX_HEADERS)
    """Request headers that must each be sent once with exactly these values for the route to take a request (names
    case-insensitive, all must match), beside hosts and path_prefix; of routes with one host and prefix, the one with
    more of them is tried first (docs/architecture.md#route-precedence)."""
    waking_page: WakingPage | None = None
    """While the workload is cold, a browser navigation gets this page at once (and the workload wakes); every
    other request is held. None: every request is held."""
    never_wake: list[NeverWakeRule] = Field(default_factory=list, max_length=32)
    """Requests the proxy answers itself (health checks, robots.txt): they never wake the workload and are not
    counted as pending. The first rule that matches decides."""
    fallback: Fallback | None = None
    """A Service in the route's namespace that takes held requests the workload was not ready for in time."""
    overflow: Overflow = "reject"
    """What a request meets when limits.max_held_requests are held: reject (503 with Retry-After), waking_page
    (navigations get the page, other requests the 503) or fallback (it goes to the fallback Service)."""

    @field_validator("match_headers")
    @classmethod
    def _match_headers(cls, headers: dict[str, str]) -> dict[str, str]:
        return lowered_headers(headers, response=False)

    @model_validator(mode="after")
    def _overflow_has_its_place(self) -> RouteFields:
        if self.overflow == "waking_page" and self.waking_page is None:
            raise ValueError("overflow: waking_page needs a waking_page")
        if self.overflow == "fallback" and self.fallback is None:
            raise ValueError("overflow: fallback needs a fallback")
        if self.fallback is not None and self.fallback.after >= self.limits.hold_timeout:
            raise ValueError(
                f"fallback.after ({self.fallback.after}s) must be below limits.hold_timeout "
                f"({self.limits.hold_timeout}s): a request is answered 504 once that is over"
            )
        return self

    @field_validator("hosts")
    @classmethod
    def _hosts(cls, hosts: list[str]) -> list[str]:
        lowered = [host.lower() for host in hosts]
        for host in lowered:
            if HOST_PATTERN.match(host) is None:
                raise ValueError(f"{host!r} is not a host name, `*.suffix` or `*`")
        return lowered

    @field_validator("path_prefix")
    @classmethod
    def _prefix(cls, prefix: str) -> str:
        if not prefix.startswith("/"):
            raise ValueError("a path prefix starts with /")
        return prefix


class RouteConfig(RouteFields):
    """A route in the proxy's config file (`proxy.routes[]`): the platform's own."""

    name: str = Field(pattern=r"^[a-z0-9]([-a-z0-9_.]*[a-z0-9])?$")
    """The route's name; with its namespace, its identity in counts, metrics and logs (`<namespace>/<name>`)."""
    namespace: str = Field(default="", pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?)?$", max_length=63)
    """The namespace the route belongs to: an HPA there reads its counts (`route=<name>`). Empty: the upstream
    Service's namespace, else the target's, else `default`."""
    upstream: ServiceUpstream | AddressUpstream
    """Where requests go: a Service (endpoints from its EndpointSlices) or a fixed address (connect probes)."""
    target: ScaleTarget | LocalScaleTarget | None = None
    """The workload a wake scales up; kind Local: development mode (`zeroscale demo`), see LocalScaleTarget."""
    readiness: Literal["auto", "endpointslice", "probe"] = "auto"
    """auto: EndpointSlice watch for a Service upstream, falling back to connect probes without API access."""
    waking_page: WakingPageWithFile | None = None
    """While the workload is cold, a browser navigation gets this page at once (and the workload wakes); every
    other request is held. Its body may come from a file (a mounted ConfigMap key). None: every request is held."""
    also_wake: list[ScaleTarget] = Field(default_factory=list, max_length=16)
    """More workloads a wake of this route wakes together with its target (what it calls, a whole stack), each
    checked by the route's wake policy on its own (nothing with wake: hpa or none); readiness is the route's
    upstream's only (docs/architecture.md#also-wake)."""

    @model_validator(mode="after")
    def _also_wake_each_once(self) -> RouteConfig:
        seen = (
            {(self.target.namespace, self.target.kind, self.target.name)}
            if isinstance(self.target, ScaleTarget)
            else set()
        )
        for extra in self.also_wake:
            key = (extra.namespace, extra.kind, extra.name)
            if key in seen:
                raise ValueError(
                    f"{ALSO_WAKE_ONCE}: {extra.kind} {extra.namespace}/{extra.name} is named twice (a wake of the "
                    "route wakes its target and each also_wake workload once)"
                )
            seen.add(key)
        return self

    @model_validator(mode="after")
    def _wake_needs_target(self) -> RouteConfig:
        if self.wake in ("scale", "always") and self.target is None:
            raise ValueError(
                f"wake: {self.wake} needs a target (namespace, kind, name); use wake: hpa or none without one"
            )
        if self.readiness == "endpointslice" and not isinstance(self.upstream, ServiceUpstream):
            raise ValueError("readiness: endpointslice needs a Service upstream")
        if (self.mode == "activator") != (self.activator is not None):
            raise ValueError("mode: activator goes with an activator block (service, port), and only with it")
        if self.mode == "activator":
            if not isinstance(self.upstream, ServiceUpstream) or self.readiness == "probe":
                raise ValueError("mode: activator needs a Service upstream (the one selecting the pods) read by slices")
            if not isinstance(self.target, ScaleTarget):
                raise ValueError("mode: activator needs a Kubernetes target: its spec.replicas says when to switch")
            if self.target.namespace != self.upstream.namespace:
                # Its spec.replicas is read in the Service's namespace, where the activator's Role is granted.
                raise ValueError(
                    f"mode: activator needs its target in the upstream's namespace ({self.upstream.namespace}), "
                    f"not {self.target.namespace}: the Service clients call and the pods it switches to are there"
                )
            if self.activator is not None and self.activator.service == self.upstream.service:
                raise ValueError("activator.service is the Service clients call, not the upstream that selects pods")
            activator, fallback = self.activator, self.fallback
            same_namespace = self.home == self.upstream.namespace  # the fallback's, the written slices'
            if (
                activator is not None
                and fallback is not None
                and same_namespace
                and fallback.service == activator.service
            ):
                # Cold, that Service's slices list the proxy's own pods: a request sent there comes back to this route,
                # is held, goes to the fallback again, and so on, a connection more each time.
                raise ValueError(
                    "fallback.service is activator.service, whose slices the proxy writes with its own pods while the "
                    "route is cold: name another Service"
                )
            if len(self.name) > LABEL_VALUE_MAX:
                # Refused here, not shortened: a label nobody can read back as the route's name helps no one.
                raise ValueError(
                    f"route {self.name} is in mode: activator, so its name is the value of the zeroscale.io/route "
                    f"label on every EndpointSlice it writes, and a label value has at most {LABEL_VALUE_MAX} "
                    f"characters (this name has {len(self.name)}): shorten the route's name"
                )
        return self

    @cached_property
    def home(self) -> str:
        """The namespace the route belongs to (`namespace`, or where its upstream or target is)."""
        if self.namespace:
            return self.namespace
        for place in (self.upstream, self.target):
            found = getattr(place, "namespace", None)
            if found:
                return str(found)
        return "default"

    @cached_property
    def key(self) -> str:
        """The route's identity everywhere (counts, metric labels, logs): `<namespace>/<name>`."""
        return f"{self.home}/{self.name}"

    def slice_port_name(self) -> str:
        """The Service port name an activator route's written slices carry."""
        assert self.activator is not None
        assert isinstance(self.upstream, ServiceUpstream)
        if self.activator.port_name is not None:
            return self.activator.port_name
        return self.upstream.port if isinstance(self.upstream.port, str) else ""
