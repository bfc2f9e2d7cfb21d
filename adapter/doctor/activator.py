"""Whether the holder of the activator Lease writes the routes of this installation's proxy (issue 28: two
installations sharing one Lease left one's Services without slices, silently). The config is read where the proxy's
pods read it, the ConfigMaps its Deployment mounts; the holder says on the Lease what it writes
(adapter/kube/leases.py, ROUTES_ANNOTATION; docs/architecture.md#activator)."""

from __future__ import annotations

import datetime
from typing import Any

from pydantic import ValidationError

from adapter.config.proxy import ProxyConfig
from adapter.doctor.findings import Finding
from adapter.doctor.grpc import Get, mounted_configs
from adapter.kube.errors import KubeError
from adapter.kube.leases import lease_path, parse_lease, unserved
from adapter.kube.watching import field

CHECK = "activator Lease"
_HINT = (
    "give each installation its own proxy.activator.lease_name (by default it follows proxy_service), or wait for "
    "a rollout of the proxy to end"
)
_NOBODY_WRITES = "are the proxy's pods running, with create on leases and get/update on this one in that namespace?"
# How far this machine's clock may be from the holder's before a Lease renewed "long ago" is taken for abandoned.
_CLOCK_SKEW = datetime.timedelta(minutes=1)


async def check_activator_lease(get: Get, namespace: str, deployment: str) -> list[Finding]:
    try:
        configs = await mounted_configs(get, namespace, deployment, ("proxy",))
    except KubeError as err:
        return [Finding("skip", CHECK, f"cannot read the proxy's config: {err}")]
    if isinstance(configs, str):
        return [Finding("skip", CHECK, configs)]
    findings = []
    for document in configs:
        try:
            proxy = ProxyConfig.model_validate(document.get("proxy") or {})
        except ValidationError as err:
            findings.append(Finding("fail", CHECK, f"the proxy settings do not load: {err.errors()[0]['msg']}"))
            continue
        findings.append(await _check(get, proxy))
    return findings


async def _check(get: Get, proxy: ProxyConfig) -> Finding:
    routes = proxy.activator_routes()
    if proxy.activator is None or not routes:
        return Finding("skip", CHECK, "no route in mode: activator")
    name = f"{proxy.activator.lease_namespace}/{proxy.activator.lease()}"
    try:
        found = await get(lease_path(proxy.activator.lease_namespace, proxy.activator.lease()))
    except KubeError as err:
        return Finding("skip", CHECK, f"cannot read Lease {name}: {err}")
    lease = parse_lease(found) if found is not None else None
    if lease is None or not lease.holder:
        return Finding(
            "fail",
            CHECK,
            f"nobody holds Lease {name}: no proxy replica writes the activator routes' slices",
            _NOBODY_WRITES,
        )
    stopped = _stopped_renewing(found or {}, lease.duration_seconds)
    if stopped:
        return Finding(
            "fail",
            CHECK,
            f"the holder of Lease {name}, {lease.holder}, has not renewed it for {stopped} (by this machine's "
            f"clock; its leaseDurationSeconds is {lease.duration_seconds}): no proxy replica writes the activator "
            "routes' slices, and none takes the Lease over",
            _NOBODY_WRITES,
        )
    if lease.routes is None:
        return Finding(
            "skip",
            CHECK,
            f"the holder of Lease {name}, {lease.holder}, does not say what it writes",
            "an older version of the proxy holds it (or another program): run the doctor again once the proxy's "
            "rollout has ended, or give this installation its own proxy.activator.lease_name",
        )
    missing = unserved(routes, lease.routes)
    if missing:
        listed = ", ".join(f"{route} ({how})" for route, how in sorted(missing.items()))
        return Finding(
            "fail",
            CHECK,
            f"the holder of Lease {name}, {lease.holder}, does not write routes of this config: {listed}; their "
            "Services get no slices, or slices decided by another config",
            _HINT,
        )
    return Finding("ok", CHECK, f"the holder of Lease {name}, {lease.holder}, writes every activator route")


def _stopped_renewing(lease: dict[str, Any], duration_seconds: int) -> str | None:
    """How long ago (h:mm:ss) the Lease was last renewed, when longer than its duration and any clock skew: nobody
    renews it (a holder killed without giving it up and no replica left, or one no longer allowed to update it).
    None when it is fresh or says no renewTime (the replicas time it on their own clocks, the doctor cannot)."""
    try:
        renewed = datetime.datetime.fromisoformat(str(field(lease, "spec").get("renewTime") or ""))
    except ValueError:
        return None
    if renewed.tzinfo is None:
        return None
    age = datetime.datetime.now(datetime.UTC) - renewed
    if age <= datetime.timedelta(seconds=duration_seconds) + _CLOCK_SKEW:
        return None
    return str(datetime.timedelta(seconds=round(age.total_seconds())))
