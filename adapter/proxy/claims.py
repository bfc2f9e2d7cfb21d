"""Which routes are served: the platform's policy for route objects, then who owns each host
(docs/architecture.md#host-claims).

The rule, the same for every route wherever it was declared: routes are taken oldest first (a ZeroscaleRoute's
creationTimestamp; the config file's routes count as older than any object, being the platform's own), then by
`<namespace>/<name>`. A host belongs to the namespace of the first route that claims it; a later route of another
namespace claiming it is refused, naming the owner. Within a namespace, routes may share a host with different
path prefixes or different match_headers; a second route with the same host, prefix and match_headers is refused,
naming the first. The order placed here is the claim order the router breaks its last ties with
(docs/architecture.md#route-precedence). A refused route is
refused whole (a route serving some of its hosts would be a surprise), and never takes a host from anyone: so
one team's mistake or late claim fails only its own route.

A route in mode activator also claims a listener port of the proxy's (within proxy.route_objects.activator_ports
for an object) and the Service whose slices it writes, each by the same rule.

Routes of the config file are not checked against each other (one author wrote them all, and the config's
load already refused what cannot work), only claim their hosts, ports and Services first.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from adapter.config.proxy import RouteObjectsConfig
from adapter.config.route import RouteConfig
from adapter.proxy.routing import Conditions, conditions_of

ACCEPTED = "Accepted"


@dataclass(frozen=True)
class Candidate:
    """A route to place: from the config file (`created` empty: older than any object) or a route object."""

    config: RouteConfig
    created: str = ""

    @property
    def from_file(self) -> bool:
        return not self.created


@dataclass(frozen=True)
class Refusal:
    reason: str  # one CamelCase word, as a condition's reason
    message: str


def place(candidates: list[Candidate], policy: RouteObjectsConfig) -> tuple[list[RouteConfig], dict[str, Refusal]]:
    """The routes served, oldest first, and why each of the others is not, by route key."""
    ordered = sorted(candidates, key=lambda candidate: (candidate.created, candidate.config.key))
    served: list[RouteConfig] = []
    served_keys: set[str] = set()  # only a file route's key can come twice (an object's is unique in the API)
    refused: dict[str, Refusal] = {}
    host_owner: dict[str, str] = {}  # host -> the key of the route whose claim made it its namespace's
    # (host, path prefix, match_headers as the router compares them) -> the route's key
    path_owner: dict[tuple[str, str, Conditions], str] = {}
    # An activator route's listener port, and the Service whose slices it writes (`<namespace>/<service>`).
    port_owner: dict[int, str] = {}
    service_owner: dict[str, str] = {}
    objects = 0
    per_namespace: Counter[str] = Counter()
    for candidate in ordered:
        route = candidate.config
        if not candidate.from_file:
            refusal = _name_refusal(route, served_keys)
            if refusal is None:
                refusal = _policy_refusal(route, policy, objects, per_namespace[route.home])
            if refusal is None:
                refusal = _claim_refusal(route, host_owner, path_owner)
            if refusal is None:
                refusal = _activator_refusal(route, policy, port_owner, service_owner)
            if refusal is not None:
                refused[route.key] = refusal
                continue
            objects += 1
            per_namespace[route.home] += 1
        conditions = conditions_of(route.match_headers)
        for host in route.hosts:
            host_owner.setdefault(host, route.key)
            path_owner.setdefault((host, route.path_prefix, conditions), route.key)
        if route.activator is not None:
            port_owner.setdefault(route.activator.port, route.key)
            service_owner.setdefault(f"{route.home}/{route.activator.service}", route.key)
        served.append(route)
        served_keys.add(route.key)
    return served, refused


def _name_refusal(route: RouteConfig, served_keys: set[str]) -> Refusal | None:
    """A route key is one route's (the table, counts and series are keyed by it): a file route of the object's
    `<namespace>/<name>` keeps it, or the object would replace the platform's route and take its hosts off the table."""
    if route.key in served_keys:
        return Refusal(
            "NameClaimed",
            f"the proxy's config file has a route named {route.key} (the platform's own): rename this one",
        )
    return None


def _policy_refusal(
    route: RouteConfig, policy: RouteObjectsConfig, served_objects: int, served_here: int
) -> Refusal | None:
    namespace = route.home
    if not policy.allowed_namespace(namespace):
        return Refusal(
            "NamespaceNotAllowed",
            f"the proxy serves route objects of the namespaces {', '.join(policy.namespaces)} only "
            "(proxy.route_objects.namespaces): ask the platform team to add this one",
        )
    for host in route.hosts:
        if not any(grant.allows(namespace, host) for grant in policy.hosts):
            return Refusal(
                "HostNotAllowed",
                f"host {host} is not one this namespace may claim (proxy.route_objects.hosts): use a host the "
                "platform granted, or ask for this one",
            )
    limits, ceilings = route.limits, policy.max_limits
    if limits is not ceilings and limits != ceilings:  # most routes ask the defaults: the ceiling's own values
        for key in type(limits).model_fields:
            asked, ceiling = getattr(limits, key), getattr(ceilings, key)
            if asked > ceiling:
                return Refusal(
                    "LimitNotAllowed",
                    f"limits.{key} is {asked:g}, above the {ceiling:g} the platform allows route objects "
                    "(proxy.route_objects.max_limits): lower it, or ask the platform team to raise the ceiling",
                )
    if served_here >= policy.max_routes_per_namespace:
        return Refusal(
            "TooManyRoutes",
            f"the proxy serves {policy.max_routes_per_namespace} route objects of this namespace already, older "
            "than this one (proxy.route_objects.max_routes_per_namespace): delete one, or ask the platform team",
        )
    if served_objects >= policy.max_routes:
        return Refusal(
            "TooManyRoutes",
            f"the proxy serves {policy.max_routes} route objects already, older than this one "
            "(proxy.route_objects.max_routes): the platform may raise it",
        )
    return None


def _claim_refusal(
    route: RouteConfig, host_owner: dict[str, str], path_owner: dict[tuple[str, str, Conditions], str]
) -> Refusal | None:
    namespace = route.home
    conditions = conditions_of(route.match_headers)
    for host in route.hosts:
        owner = host_owner.get(host)
        if owner is not None and owner.split("/", 1)[0] != namespace:
            return Refusal(
                "HostClaimed",
                f"host {host} belongs to route {owner}, an older claim from another namespace "
                "(the oldest route claiming a host wins it): choose another host",
            )
        first = path_owner.get((host, route.path_prefix, conditions))
        if first is not None:
            same = " and the same match_headers" if route.match_headers else ""
            return Refusal(
                "PathClaimed",
                f"host {host} with path prefix {route.path_prefix}{same} is served by route {first}, an older one: "
                "give this route another path_prefix, host or match_headers, or delete one of the two",
            )
    return None


def _activator_refusal(
    route: RouteConfig, policy: RouteObjectsConfig, port_owner: dict[int, str], service_owner: dict[str, str]
) -> Refusal | None:
    activator = route.activator
    if activator is None:
        return None
    ports = policy.activator_ports
    if ports is None:
        return Refusal(
            "ActivatorNotAllowed",
            "the proxy serves no route object in mode activator (proxy.route_objects.activator_ports is not set): "
            "use mode in_path, or ask the platform team for activator ports",
        )
    if activator.port not in ports:
        return Refusal(
            "PortNotAllowed",
            f"activator.port {activator.port} is outside the ports open to routes, {ports.first}-{ports.last} "
            "(proxy.route_objects.activator_ports)",
        )
    owner = port_owner.get(activator.port)
    if owner is not None:
        return Refusal(
            "PortClaimed", f"activator.port {activator.port} is taken by route {owner}, an older one: choose another"
        )
    owner = service_owner.get(f"{route.home}/{activator.service}")
    if owner is not None:
        return Refusal(
            "ServiceClaimed",
            f"Service {activator.service} has its EndpointSlices written by route {owner}, an older one: one "
            "activator route per Service",
        )
    return None
