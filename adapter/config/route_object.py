"""A ZeroscaleRoute (`zeroscale.io/v1alpha1`): one team's route, declared in its own namespace.

Its spec is a route of the config file (adapter/config/route.py) without the names of other places: the upstream
Service, the target workload and the activator's Service are all in the route's own namespace, and its name is
the object's. `RouteSpec` owns that shape; the CRD's schema is generated from it (scripts/crd/generate.py), with
CEL rules for what a schema cannot say, so the API server refuses a bad route at admission and the proxy checks
the same model again when it reads one (a CRD installed from an older version may let more through).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError

from adapter.config.base import Duration, Strict
from adapter.config.route import (
    DNS_LABEL,
    RouteConfig,
    RouteFields,
    RouteLimits,
    ScaleTarget,
    ServiceUpstream,
    UpstreamProtocol,
)

GROUP = "zeroscale.io"
VERSION = "v1alpha1"
KIND = "ZeroscaleRoute"
PLURAL = "zeroscaleroutes"
SINGULAR = "zeroscaleroute"
SHORT_NAMES = ["zsroute", "zsr"]
API_VERSION = f"{GROUP}/{VERSION}"


class RouteService(Strict):
    """A Service in the route's namespace, selecting the workload's pods; its EndpointSlices say which are ready."""

    service: str = Field(pattern=DNS_LABEL, max_length=63)
    """The Service's name (in the route's own namespace: a route cannot name another namespace's Service)."""
    # Bounded as the API bounds a Service port (a name a DNS label, a number 1-65535): the proxy keeps every object it
    # reads, so an unbounded string here was megabytes of a shared process's memory per route.
    port: (
        Annotated[str, Field(max_length=63, pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?)?$")]
        | Annotated[int, Field(ge=1, le=65535)]
    ) = Field(default="", json_schema_extra={"x-kubernetes-int-or-string": True})
    """The Service port's name (matched against EndpointSlice `ports[].name`) or its number; empty: its only port."""
    protocol: UpstreamProtocol = "auto"
    """The HTTP the pods speak: http1, h2c (HTTP/2 over cleartext with prior knowledge: gRPC servers), or auto: h2c
    when the Service port's appProtocol is `kubernetes.io/h2c`, else HTTP/1.1."""


class RouteTarget(Strict):
    """The workload a wake scales up, in the route's namespace (its scale subresource is patched)."""

    kind: Literal["Deployment", "StatefulSet", "ReplicaSet"] = "Deployment"
    """The workload's kind."""
    name: str = Field(pattern=DNS_LABEL, max_length=253)
    """The workload's name."""


# The data plane checks every connection's deadlines at a quarter of the shortest of these over all routes
# (RouteTable.sweep_tick): below this floor, one team's route would make the shared proxy walk every connection of
# every team up to a hundred times a second.
_TIMEOUT_FLOOR = 1.0


class RouteObjectLimits(RouteLimits):
    """A route object's limits: the file route's, with floors on the timeouts the data plane sweeps for."""

    body_timeout: Duration = Field(default=60.0, ge=_TIMEOUT_FLOOR)
    """From the request's head to its body's last byte: the whole body must arrive within this (408 beyond; at least
    1s). Raise it on a route that takes large uploads from slow clients."""
    response_timeout: Duration = Field(default=60.0, ge=_TIMEOUT_FLOOR)
    """From the request's last byte sent to the response head, and then the longest silence within the response body
    while the client keeps reading (504 before the head; the response is cut off after; at least 1s)."""
    tunnel_idle_timeout: Duration = Field(default=300.0, ge=_TIMEOUT_FLOOR)
    """A tunnel with no byte in either direction for this long is closed (at least 1s)."""


class RouteSpec(RouteFields):
    """What a team declares: which requests the route takes, the Service they go to and the workload it wakes."""

    hosts: list[str] = Field(min_length=1, max_length=64)
    """Exact host names or `*.suffix` wildcards (matched case-insensitively, port ignored). Required: a route object
    claims its hosts, and the oldest claim of a host wins it across namespaces (`kubectl get zsr -A`)."""
    upstream: RouteService
    """Where requests go: a Service in this namespace."""
    target: RouteTarget | None = None
    """The workload to wake (wake: scale or always need it)."""
    # Floors the file's routes do not have: a tenant's route must not make the shared proxy dial or patch in a loop.
    wake_retry_interval: Duration = Field(default=5.0, ge=1.0)
    """While requests are held and the target still reads 0, wake again this often (at least 1s)."""
    probe_interval: Duration = Field(default=0.01, ge=0.005)
    """How often an endpoint that refused a connection is dialled again while requests wait (at least 5ms)."""
    limits: RouteObjectLimits = Field(default_factory=RouteObjectLimits)
    """What the route may hold and how long each phase of a request may take (within the platform's
    proxy.route_objects.max_limits)."""
    also_wake: list[RouteTarget] = Field(default_factory=list, max_length=16)
    """More workloads in this namespace a wake of this route wakes together with its target (what it calls),
    each checked by the route's wake policy on its own (nothing with wake: hpa or none); readiness is the route's
    upstream's only (docs/architecture.md#also-wake)."""

    def route_config(self, namespace: str, name: str) -> RouteConfig:
        """The route as the proxy runs it; ValueError (pydantic's) when the combination is not allowed."""
        fields = self.model_dump(exclude={"upstream", "target", "also_wake"})
        return RouteConfig(
            **fields,
            name=name,
            namespace=namespace,
            upstream=ServiceUpstream(
                service=self.upstream.service,
                namespace=namespace,
                port=self.upstream.port,
                protocol=self.upstream.protocol,
            ),
            target=None if self.target is None else ScaleTarget(namespace=namespace, **self.target.model_dump()),
            also_wake=[ScaleTarget(namespace=namespace, **target.model_dump()) for target in self.also_wake],
            # An object's upstream is always a Service read from its slices: no address to probe instead.
            readiness="endpointslice",
        )


class Condition(Strict):
    """A condition as every Kubernetes object reports them (`kubectl wait --for=condition=Ready` reads them)."""

    type: str
    """Accepted (the route is valid, allowed and wins its hosts) or Ready (its Service, target and readiness known)."""
    status: Literal["True", "False", "Unknown"]
    """True, False or Unknown (not yet known, e.g. before the first readiness answer)."""
    reason: str
    """One CamelCase word."""
    message: str
    """What happened, and what to change."""
    lastTransitionTime: str
    """When the status last changed (RFC 3339)."""
    observedGeneration: int = 0
    """The spec's generation this condition was computed from."""


class RouteStatus(Strict):
    """What the proxy saw of this route, written by one proxy replica (the Lease holder) at most every few seconds."""

    observedGeneration: int = 0
    """The spec's generation the status describes."""
    conditions: list[Condition] = Field(default_factory=list)
    """Accepted and Ready."""
    state: Literal["Cold", "Warm", "Unknown"] = "Unknown"
    """Cold: no ready endpoint (requests are held and wake the target); Warm: requests go straight through."""
    held: int = 0
    """Requests the writing replica holds for this route now."""
    lastColdStartSeconds: float | None = None
    """How long the last cold start took, from the first held request (or the wake) to a ready endpoint."""


def route_key(obj: dict[str, Any]) -> str:
    """`<namespace>/<name>` of a ZeroscaleRoute object."""
    metadata = obj.get("metadata") or {}
    return f"{metadata.get('namespace', '')}/{metadata.get('name', '')}"


def parse_route(obj: dict[str, Any]) -> RouteConfig:
    """The route a ZeroscaleRoute object declares; ValueError with a message for its status when it is not one."""
    metadata = obj.get("metadata")
    if not isinstance(metadata, dict):
        raise ValueError("the object has no metadata")
    namespace, name = metadata.get("namespace"), metadata.get("name")
    if not isinstance(namespace, str) or not isinstance(name, str):
        raise ValueError("the object has no namespace or name")
    try:
        return RouteSpec.model_validate(obj.get("spec") or {}).route_config(namespace, name)
    except ValidationError as err:
        raise ValueError(_first_error(err)) from None


def _first_error(err: ValidationError) -> str:
    """One line a person can act on: the first problem and where it is in the spec."""
    problems = err.errors(include_url=False)
    first = problems[0]
    where = ".".join(str(part) for part in first["loc"] if not isinstance(part, int) or part >= 0)
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    return f"spec.{where}: {first['msg']}{more}" if where else f"spec: {first['msg']}{more}"
