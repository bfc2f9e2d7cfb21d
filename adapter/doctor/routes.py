"""Whether ZeroscaleRoutes are served: the CRD is installed (the API serves zeroscale.io/v1alpha1), and each route's
status, as the proxy's Lease holder writes it, says Accepted and Ready for the route's current spec. A status left
behind its spec (observedGeneration below metadata.generation) for long means no proxy is reading routes.

Whether the proxy serves route objects at all is read where its pods read it, the config its Deployment mounts.
"""

from __future__ import annotations

import datetime
from typing import Any

from pydantic import ValidationError

from adapter.config.proxy import RouteObjectsConfig
from adapter.config.route_object import GROUP, PLURAL, VERSION, route_key
from adapter.doctor.findings import Finding, Level
from adapter.doctor.grpc import Get, mounted_configs
from adapter.kube.errors import KubeError

CHECK_CRD = "route CRD"
CHECK = "routes"
DISCOVERY_PATH = f"/apis/{GROUP}/{VERSION}"
ROUTES_PATH = f"/apis/{GROUP}/{VERSION}/{PLURAL}"  # every namespace's
# The proxy writes a route's status within proxy.route_objects.status_interval (5 s by default) of a change, its
# conditions at once: a status still behind its spec after this long is not being written.
STALE_AFTER = datetime.timedelta(minutes=2)
# Routes named one by one at most; the rest are counted (`kubectl get zsr -A` lists them all).
MAX_NAMED = 20
_WORST_FIRST: tuple[Level, ...] = ("fail", "warn", "skip")
INSTALL_HINT = (
    "kubectl apply --server-side -f deploy/helm/zeroscale/crds/ (Helm installs crds/ on `helm install` only; "
    "deploy/base includes deploy/crds)"
)
NOBODY_READS_HINT = (
    "is the proxy running with proxy.route_objects.enabled, allowed to watch zeroscaleroutes, and holding its "
    "Lease (the activator Lease check)? `kubectl -n <proxy namespace> logs deploy/<proxy>` says why not"
)
ROUTE_HINT = "`kubectl -n <namespace> describe zsr <name>`: its conditions say what to change in its spec"


async def check_routes(get: Get, namespace: str, proxy_deployment: str, now: datetime.datetime) -> list[Finding]:
    served = await _served(get, namespace, proxy_deployment)
    try:
        discovery = await get(DISCOVERY_PATH)
    except KubeError as err:
        return [Finding("skip", CHECK_CRD, f"cannot read the API's discovery of {GROUP}/{VERSION}: {err}")]
    resources = {resource.get("name") for resource in (discovery or {}).get("resources") or []}
    if PLURAL not in resources:
        missing = f"the API does not serve {PLURAL}.{GROUP} ({VERSION}): its CRD is not installed"
        if served:
            message = f"the proxy serves ZeroscaleRoutes (proxy.route_objects.enabled) but {missing}"
            return [Finding("fail", CHECK_CRD, message, INSTALL_HINT)]
        return [Finding("skip", CHECK_CRD, f"{missing}; routes come from the proxy's config alone")]
    findings = [Finding("ok", CHECK_CRD, f"CRD {PLURAL}.{GROUP} is installed ({VERSION} served)")]
    try:
        listed = await get(ROUTES_PATH)
    except KubeError as err:
        return [*findings, Finding("skip", CHECK, f"cannot list ZeroscaleRoutes: {err}")]
    routes = (listed or {}).get("items") or []
    if routes and served is False:
        message = (
            f"{len(routes)} ZeroscaleRoute(s) exist but the proxy does not serve route objects "
            "(proxy.route_objects.enabled is false): they route nothing"
        )
        hint = "turn them on: the chart's routeObjects.enabled, or proxy.route_objects.enabled in the config"
        return [*findings, Finding("warn", CHECK, message, hint)]
    return findings + _statuses(routes, now)


async def _served(get: Get, namespace: str, deployment: str) -> bool | None:
    """Whether the proxy's mounted config turns route objects on; None when it cannot be read."""
    try:
        configs = await mounted_configs(get, namespace, deployment, ("proxy",))
    except KubeError:
        return None
    if isinstance(configs, str):
        return None
    try:
        return any(
            RouteObjectsConfig.model_validate((document.get("proxy") or {}).get("route_objects") or {}).enabled
            for document in configs
        )
    except ValidationError:
        return None  # the activator Lease check reports a config that does not load


def _statuses(routes: list[dict[str, Any]], now: datetime.datetime) -> list[Finding]:
    noted = [found for found in (_route(route, now) for route in routes) if found is not None]
    findings = noted[:MAX_NAMED]
    rest = noted[MAX_NAMED:]
    if rest:
        worst = next(level for level in _WORST_FIRST if any(found.level == level for found in rest))
        findings.append(
            Finding(worst, CHECK, f"and {len(rest)} more route(s)", "`kubectl get zsr -A -o wide` lists them")
        )
    fine = len(routes) - len(noted)
    if fine or not routes:
        text = f"{fine} route(s) Accepted and Ready" if routes else "no ZeroscaleRoute in the cluster"
        findings.append(Finding("ok", CHECK, text))
    return findings


def _route(route: dict[str, Any], now: datetime.datetime) -> Finding | None:
    """What is wrong with one route, by its status; None when it is Accepted and Ready for its current spec."""
    key = route_key(route)
    status = route.get("status") or {}
    generation = int((route.get("metadata") or {}).get("generation") or 0)
    observed = int(status.get("observedGeneration") or 0)
    if observed < generation:
        behind = now - _spec_written(route)
        age = datetime.timedelta(seconds=round(max(behind.total_seconds(), 0)))
        if behind <= STALE_AFTER:  # being read: the proxy writes its status within seconds
            return Finding("skip", CHECK, f"route {key}: changed {age} ago, its status not yet written for it")
        message = (
            f"route {key}: its status describes generation {observed} but its spec is at {generation}, changed {age} "
            "ago: no proxy is reading routes"
        )
        return Finding("fail", CHECK, message, NOBODY_READS_HINT)
    conditions = {c.get("type"): c for c in status.get("conditions") or [] if isinstance(c, dict)}
    for kind in ("Accepted", "Ready"):
        condition = conditions.get(kind) or {}
        if condition.get("status") == "True":
            continue
        said = f"{condition.get('reason') or 'NoReason'}: {condition.get('message') or 'no message'}"
        if condition.get("status") == "False":
            return Finding("fail", CHECK, f"route {key} is not {kind.lower()}: {said}", ROUTE_HINT)
        return Finding("warn", CHECK, f"route {key}: {kind} is not known yet ({said})", ROUTE_HINT)
    return None


def _spec_written(route: dict[str, Any]) -> datetime.datetime:
    """When the spec was last written: the latest time of its managers' writes but the status's (managedFields),
    else the object's creation."""
    metadata = route.get("metadata") or {}
    times = [
        str(entry.get("time") or "")
        for entry in metadata.get("managedFields") or []
        if isinstance(entry, dict) and entry.get("subresource") != "status"
    ]
    known = [at for at in map(_time, times or [str(metadata.get("creationTimestamp") or "")]) if at is not None]
    return max(known) if known else datetime.datetime.min.replace(tzinfo=datetime.UTC)


def _time(text: str) -> datetime.datetime | None:
    try:
        at = datetime.datetime.fromisoformat(text)
    except ValueError:
        return None
    return at if at.tzinfo is not None else None
