"""Whether the holder of the activator Lease writes the routes of this installation's proxy (issue 28: two
installations sharing one Lease left one's Services without slices, silently). The config is read where the proxy's
pods read it, the ConfigMaps its Deployment mounts; the holder says on the Lease what it writes
(adapter/kube/leases.py, ROUTES_ANNOTATION; docs/architecture.md#activator)."""

from __future__ import annotations

from pydantic import ValidationError

from adapter.config.proxy import ProxyConfig
from adapter.doctor.findings import Finding
from adapter.doctor.grpc import Get, mounted_configs
from adapter.kube.errors import KubeError
from adapter.kube.leases import lease_path, parse_lease, unserved

CHECK = "activator Lease"
_HINT = (
    "give each installation its own proxy.activator.lease_name (by default it follows proxy_service), or wait for "
    "a rollout of the proxy to end"
)


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
            "are the proxy's pods running, with get/create/update on leases in that namespace?",
        )
    if lease.routes is None:
        return Finding("skip", CHECK, f"the holder of Lease {name}, {lease.holder}, does not say what it writes")
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
