"""Settings of `zeroscale proxy`: listeners, connection defences and the routes it holds requests for.

Cluster mode lists `routes`; sidecar mode sets `sidecar.upstream` alone, so a pod can run the
proxy from its environment (`ZEROSCALE_PROXY__SIDECAR__UPSTREAM=127.0.0.1:8081`, `ZEROSCALE_PROXY__PORT=8080`).
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
from pathlib import Path

from pydantic import Field, field_validator, model_validator

from adapter.config.base import Duration, Strict, split_address
from adapter.config.kube import SERVICE_ACCOUNT_DIR, KubeAPIConfig
from adapter.config.route import (
    DNS_LABEL,
    AddressUpstream,
    RouteConfig,
    RouteLimits,
    ServiceRef,
    ServiceUpstream,
    UpstreamProtocol,
)
from adapter.k8s_wire.endpoint_ip import LOOPBACK, NOT_AN_IP, endpoint_refusal


def pod_namespace(path: Path = SERVICE_ACCOUNT_DIR / "namespace") -> str:
    """The namespace of the pod this runs in, as its service account's mounted token says; `default` outside one."""
    try:
        return path.read_text(encoding="utf-8").strip() or "default"
    except FileNotFoundError:
        return "default"


class SidecarConfig(Strict):
    """One upstream beside the proxy in the same pod: every request goes there, readiness by connect probes."""

    upstream: str
    """The app beside the proxy in the pod, as `host:port` (usually `127.0.0.1:<port>`)."""
    route: str = Field(default="sidecar", pattern=r"^[a-z0-9]([-a-z0-9_.]*[a-z0-9])?$")
    """The route name its counts are reported under: the cluster route's name, so that a route's `http` metric sums what
    the cluster proxies hold and what the sidecars have in flight (docs/architecture.md#activator)."""
    namespace: str = Field(default_factory=lambda: pod_namespace(), pattern=DNS_LABEL)
    """The pod's namespace: the route's counts are reported as `<namespace>/<route>`, which an HPA in that namespace
    reads as `route=<route>`. Set it from the downward API (metadata.namespace); unset: the namespace of the pod's
    service account token, if mounted, else `default`."""
    limits: RouteLimits = Field(default_factory=RouteLimits)
    """What the sidecar's route may hold and how long each phase of a request may take."""
    probe_interval: Duration = Field(default=0.01, gt=0)
    """How often the app is dialled again while requests wait for it."""
    protocol: UpstreamProtocol = "auto"
    """The HTTP the app beside it speaks: http1 (auto) or h2c (a gRPC server). Clients may speak either to the proxy."""

    @field_validator("upstream")
    @classmethod
    def _address(cls, value: str) -> str:
        split_address(value)
        return value

    def as_route(self) -> RouteConfig:
        return RouteConfig(
            name=self.route,
            namespace=self.namespace,
            upstream=AddressUpstream(address=self.upstream, protocol=self.protocol),
            wake="none",
            readiness="probe",
            probe_interval=self.probe_interval,
            limits=self.limits,
        )


class ActivatorConfig(Strict):
    """What every `mode: activator` route of this proxy shares: where the proxy's own pods are listed, and the
    Lease through which one replica at a time writes the routes' EndpointSlices (docs/protocols.md#leases)."""

    proxy_service: ServiceRef
    """The Service selecting the proxy's own pods: its EndpointSlices list them (any port of it; only the addresses are
    used, with each route's activator.port)."""
    lease_namespace: str = Field(pattern=DNS_LABEL)
    """The namespace of the Lease whose holder writes the routes' EndpointSlices."""
    lease_name: str = Field(default="", pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?)?$", max_length=253)
    """Empty: `<proxy_service.service>-activator` (prefixed with `<proxy_service.namespace>.` when that is not
    lease_namespace), so each installation, with a proxy Service of its own, has a Lease of its own: two sharing one
    would leave one's routes unwritten (docs/architecture.md#activator)."""
    identity: str = Field(default="", max_length=253)
    """This replica's name in the Lease; empty: the host name (a pod's name). Set it from the downward API."""
    lease_duration: Duration = Field(default=15.0, gt=0)
    """As Kubernetes' own components elect a leader: a holder that has not renewed for lease_duration is replaced; a
    holder that could not renew within renew_deadline stops writing; everyone retries every retry_period."""
    renew_deadline: Duration = Field(default=10.0, gt=0)
    """A holder that could not renew the Lease within this long stops writing."""
    retry_period: Duration = Field(default=2.0, gt=0)
    """Every replica tries to take or renew the Lease this often."""
    resync_interval: Duration = Field(default=30.0, gt=0)
    """The written slices are listed and compared with what they should be this often, whatever the watches said."""

    def lease(self) -> str:
        """The Lease's name: lease_name, or the one that follows the installation's proxy Service."""
        if self.lease_name:
            return self.lease_name
        service = self.proxy_service
        # Joined by a dot, which neither name may hold (a Lease's name may): by a `-`, a/zeroscale-proxy and
        # a-zeroscale/proxy would share one.
        prefix = "" if service.namespace == self.lease_namespace else f"{service.namespace}."
        return f"{prefix}{service.service}-activator"

    @model_validator(mode="after")
    def _lease_timing(self) -> ActivatorConfig:
        if not self.retry_period < self.renew_deadline < self.lease_duration:
            raise ValueError("retry_period < renew_deadline < lease_duration, or two replicas may both write")
        return self


class HostGrant(Strict):
    """Host names the routes of some namespaces may claim (docs/architecture.md#host-claims)."""

    namespaces: list[str] = Field(default_factory=lambda: ["*"], min_length=1)
    """Namespaces this grant is for; `*`: every namespace."""
    hosts: list[str] = Field(default_factory=lambda: ["[!*]*"], min_length=1)
    """Shell-style patterns a claimed host (as written in the route: `shop.example.com`, `*.example.com`) must
    match; `{namespace}` stands for the route's namespace, e.g. `{namespace}.apps.example.com` (end the namespace with
    a dot, not `-`: `{namespace}-*` would let namespace `a` claim the hosts of `a-b`). The default, `[!*]*`, is any
    exact host and no wildcard: a wildcard or `*` claim (all the hosts nobody else claims) is the platform's to
    grant, as `*.example.com` or `*`."""

    def allows(self, namespace: str, host: str) -> bool:
        if "*" not in self.namespaces and namespace not in self.namespaces:
            return False
        return any(fnmatch.fnmatchcase(host, pattern.replace("{namespace}", namespace)) for pattern in self.hosts)


class PortRange(Strict):
    """Ports of the proxy's pods, first to last (both included)."""

    first: int = Field(ge=1, le=65535)
    """The first port of the range."""
    last: int = Field(ge=1, le=65535)
    """The last port of the range (not below first)."""

    @model_validator(mode="after")
    def _ordered(self) -> PortRange:
        if self.first > self.last:
            raise ValueError(f"first ({self.first}) must not be above last ({self.last})")
        return self

    def __contains__(self, port: object) -> bool:
        return isinstance(port, int) and self.first <= port <= self.last


class RouteObjectsConfig(Strict):
    """ZeroscaleRoute objects: routes each team declares in its own namespace, read live (docs/architecture.md#routes).
    Needs `proxy.activator` for its Lease: one replica, its holder, writes the routes' status."""

    enabled: bool = False
    """Watch ZeroscaleRoute objects (the CRD must be installed; without it the file's routes serve alone)."""
    namespaces: list[str] = Field(default_factory=list)
    """The namespaces whose routes are served; empty: every namespace. A route elsewhere is refused in its status."""
    hosts: list[HostGrant] = Field(default_factory=lambda: [HostGrant()])
    """Which hosts each namespace may claim; a route claiming one no grant allows is refused in its status."""
    max_routes: int = Field(default=10_000, ge=1)
    """Route objects served at most (the oldest first); the rest are refused in their status."""
    max_routes_per_namespace: int = Field(default=1000, ge=1)
    """Route objects of one namespace served at most (its oldest first): one team's burst of objects cannot use up
    max_routes for every other team (nor make the busy routes of one proxy more than the adapter's http source
    reads, its `max_routes`)."""
    status_interval: Duration = Field(default=5.0, gt=0)
    """A route's status is written at most this often (its conditions at once when they change)."""
    max_limits: RouteLimits = Field(default_factory=RouteLimits)
    """The most a route object's `limits` may ask, each key (held requests and bytes, timeouts, concurrency): the
    proxy's memory and connections are shared by every team, so a route asking more is refused in its status. By
    default the defaults: a team may lower its limits, and raise them only as far as the platform allows here."""
    activator_ports: PortRange | None = None
    """The ports route objects in mode activator may take (`activator.port`), each a listener of its own on every
    proxy pod (the chart's NetworkPolicy admits them); none: objects in mode activator are refused. The activator
    also writes EndpointSlices in the route's namespace: the proxy needs the Role for it there."""

    def allowed_namespace(self, namespace: str) -> bool:
        return not self.namespaces or namespace in self.namespaces


class Http2Config(Strict):
    """HTTP/2 from clients (prior knowledge, on the proxy's ports): what one connection may cost
    (docs/architecture.md#h2-defences). Header sizes and counts, and the deadlines, are the HTTP/1.1 settings."""

    enabled: bool = True
    """Accept HTTP/2 with prior knowledge beside HTTP/1.1 (false: the preface is answered as a malformed request)."""
    max_concurrent_streams: int = Field(default=100, ge=1, le=2**31 - 1)
    """Streams one connection may have open at once (SETTINGS_MAX_CONCURRENT_STREAMS); a client opening more is
    sent GOAWAY."""
    max_stream_resets: int = Field(default=200, ge=1)
    """Streams a client may reset within abuse_window (rapid reset, CVE-2023-44487); more, and more than it let
    finish in that window, and it is sent GOAWAY ENHANCE_YOUR_CALM (a busy client cancelling calls is not cut off)."""
    max_control_frames: int = Field(default=1000, ge=1)
    """SETTINGS, PING, PRIORITY and unknown frames a client may send within abuse_window; then GOAWAY
    ENHANCE_YOUR_CALM."""
    abuse_window: Duration = Field(default=10.0, gt=0)
    """The period max_stream_resets and max_control_frames count over."""


class ProxyConfig(Strict):
    bind: str = "0.0.0.0"
    """The address the proxy listens on for clients."""
    port: int = Field(default=8080, ge=0, le=65535)
    """The port clients' requests arrive on."""
    admin_bind: str = "0.0.0.0"
    """The address of the admin listener (metrics, health and readiness probes)."""
    admin_port: int = Field(default=9090, ge=0, le=65535)
    """The admin listener's port."""
    max_connections: int = Field(default=10_000, ge=1)
    """Client connections open at once; more are refused until some close."""
    admin_max_connections: int = Field(default=64, ge=1)
    """Connections at once on the admin port (metrics, probes); more are closed unanswered."""
    max_request_line_bytes: int = Field(default=8192, ge=64)
    """The longest request line (method, target, version) a client may send (414 beyond)."""
    max_header_bytes: int = Field(default=16_384, ge=256)
    """The largest request head a client may send, all header fields together (431 beyond)."""
    max_headers: int = Field(default=100, ge=4)
    """Header fields one request may have (431 beyond)."""
    header_timeout: Duration = 10.0
    """How long a request's head may take to arrive, all of its header fields (408 beyond)."""
    idle_timeout: Duration = 75.0
    """A keep-alive connection with no request for this long is closed."""
    send_timeout: Duration = Field(default=60.0, gt=0)
    """A client that reads none of its response for this long (the proxy's send buffer stays full) is cut off."""
    max_pipelined_bytes: int = Field(default=64 * 1024, ge=1024)
    """Bytes read from a client past the request being answered (pipelined requests); more are refused with 503."""
    grace_period: Duration = 25.0
    """SIGTERM: held and in-flight requests get this long to finish; the rest are answered 503."""
    stop_delay: Duration = 0.0
    """SIGTERM: first keep accepting new connections this long (the admin port already says not ready), so those made
    while every node's kube-proxy learns the pod is going still find a listener; then drain. The margin the activator's
    switches rely on: set it above the data plane's propagation delay (docs/architecture.md#activator)."""
    via: bool = False
    """Add a `Via` header to requests and responses (RFC 9110 7.6.3)."""
    http2: Http2Config = Field(default_factory=Http2Config)
    """HTTP/2 from clients, and what one HTTP/2 connection may cost."""
    kubernetes: KubeAPIConfig = Field(default_factory=KubeAPIConfig)
    """How the proxy reaches the Kubernetes API (EndpointSlices, scale, Leases, route objects)."""
    routes: list[RouteConfig] = Field(default_factory=list)
    """Cluster mode: the routes requests are held and forwarded for."""
    sidecar: SidecarConfig | None = None
    """Sidecar mode: one upstream beside the proxy in the same pod, instead of routes."""
    activator: ActivatorConfig | None = None
    """Needed by routes in mode: activator."""
    route_objects: RouteObjectsConfig = Field(default_factory=RouteObjectsConfig)
    """Routes as ZeroscaleRoute objects, beside the ones above."""
    allow_loopback_endpoints: bool = False
    """Development only (`zeroscale demo`, tests on a stand-in of the API): a loopback address may be a route's
    endpoint, from the config, a slice or a name's DNS answer. In a cluster one is the proxy's own pod (its admin port,
    its counts), never an upstream, and the API refuses it in a slice (docs/architecture.md#only-ip-endpoints). A
    sidecar's upstream, the app beside it in the pod, is on loopback whatever this says."""

    @model_validator(mode="after")
    def _one_mode(self) -> ProxyConfig:
        if self.sidecar is not None and self.routes:
            raise ValueError("set either routes (cluster mode) or sidecar, not both")
        if self.route_objects.enabled and (self.sidecar is not None or self.activator is None):
            raise ValueError(
                "route_objects needs cluster mode and proxy.activator (proxy_service, lease_namespace): its Lease "
                "elects the one replica that writes the routes' status"
            )
        object_ports = self.route_objects.activator_ports
        if object_ports is not None and (
            {self.port, self.admin_port} & set(range(object_ports.first, object_ports.last + 1))
            or any(route.activator is not None and route.activator.port in object_ports for route in self.routes)
        ):
            raise ValueError(
                "route_objects.activator_ports must not hold the proxy's port, its admin_port or a port of an "
                "activator route of the file"
            )
        names = [route.key for route in self.routes]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"route names must be unique: {', '.join(duplicates)}")
        activators = [route for route in self.routes if route.activator is not None]
        if activators and self.activator is None:
            raise ValueError(
                f"route {activators[0].name} is in mode: activator: "
                "set proxy.activator (proxy_service, lease_namespace)"
            )
        services = [
            f"{route.upstream.namespace}/{route.activator.service}"
            for route in activators
            if route.activator and isinstance(route.upstream, ServiceUpstream)
        ]
        shared = sorted({service for service in services if services.count(service) > 1})
        if shared:
            # Each route writes the Service's slices from its own decision: they would overwrite each other.
            raise ValueError(f"one activator route per Service: {', '.join(shared)} has several")
        ports = [route.activator.port for route in activators if route.activator is not None]
        if len(set(ports)) != len(ports) or {self.port, self.admin_port} & set(ports):
            raise ValueError("each activator route needs a port of its own, not the proxy's port or admin_port")
        return self

    @model_validator(mode="after")
    def _only_ip_endpoints(self) -> ProxyConfig:
        """An address in the config that may not be an endpoint is refused at load (names: when they resolve)."""
        given = [
            (f"route {r.name}", getattr(r.upstream, "address", None), self.allow_loopback_endpoints)
            for r in self.routes
        ]
        if self.sidecar is not None:
            given.append(("proxy.sidecar", self.sidecar.upstream, True))
        for where, address, loopback in given:
            why = endpoint_refusal(split_address(address)[0]) if address else None
            if why not in (None, NOT_AN_IP) and not (why == LOOPBACK and loopback):
                hint = " (set proxy.allow_loopback_endpoints for development)" if why == LOOPBACK else ""
                raise ValueError(
                    f"{where}: upstream address {address} is {why.replace('_', '-')}, which may not be an endpoint "
                    f"(docs/architecture.md#only-ip-endpoints){hint}: give the upstream's own address or name"
                )
        return self

    def activator_routes(self, routes: list[RouteConfig] | None = None) -> dict[str, str]:
        """What each activator route (of the file, or of `routes`) writes, by route key:
        `<namespace>/<service>@<digest>`, the digest of all the slices depend on (the route's name, upstream, target
        and activator settings, and the proxy's own Service). The Lease holder publishes its set; a replica whose
        entry is not in it is not served (leader.py)."""
        proxy_service = self.activator.proxy_service.model_dump() if self.activator is not None else None
        served = {}
        for route in self.routes if routes is None else routes:
            if route.activator is None:
                continue
            fields = route.model_dump(mode="json", include={"name", "upstream", "target", "activator"})
            digest = hashlib.sha256(json.dumps([fields, proxy_service], sort_keys=True).encode()).hexdigest()[:12]
            served[route.key] = f"{route.upstream.namespace}/{route.activator.service}@{digest}"  # type: ignore[union-attr]
        return served

    def effective_routes(self) -> list[RouteConfig]:
        return [self.sidecar.as_route()] if self.sidecar is not None else list(self.routes)
