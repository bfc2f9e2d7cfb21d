"""Leases (coordination.k8s.io/v1, docs/protocols.md#leases): read one, take it, renew it, give it back.

Every write is an update conditioned on the resourceVersion read (or a create, which fails if someone else created
it first), so two replicas never both believe a write of theirs made them the holder: one gets 409 Conflict.

Each write also names the writing process in the annotation INSTANCE_ANNOTATION: holderIdentity is a name people
choose (a host name, which pods share with hostNetwork or spec.hostname), and a replica that took a Lease naming
its identity for its own would renew another process's Lease and lead beside it.

And each write says, in ROUTES_ANNOTATION, what the holder writes (a JSON list of its activator routes, as
ProxyConfig.activator_routes names them): a replica reading it knows whether the holder serves its routes too.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from adapter.kube.client import KubeClient
from adapter.kube.errors import KubeAPIError
from adapter.kube.watching import field

INSTANCE_ANNOTATION = "zeroscale.io/leader-instance"
ROUTES_ANNOTATION = "zeroscale.io/activator-routes"


@dataclass(frozen=True)
class Lease:
    holder: str
    duration_seconds: int
    transitions: int
    acquire_time: str
    resource_version: str
    instance: str = ""  # the process that wrote it (INSTANCE_ANNOTATION); "" when written by another program
    # What the holder writes (ROUTES_ANNOTATION); None when it does not say (another program, an older version).
    routes: frozenset[str] | None = None

    def record(self) -> tuple[str, str]:
        """What changes whenever the holder renews or changes: the leader election's clock reads this."""
        return self.holder, self.resource_version


def unserved(mine: dict[str, str], theirs: frozenset[str]) -> dict[str, str]:
    """Which of `mine` (route name -> `<namespace>/<service>@<digest>`) the holder's ROUTES_ANNOTATION lacks, each with
    how: "not written" (nobody writes its Service), or "written from another config" (its Service, not as ours)."""
    services = {entry.split("@")[0] for entry in theirs}
    return {
        route: "written from another config" if entry.split("@")[0] in services else "not written"
        for route, entry in mine.items()
        if entry not in theirs
    }


def lease_path(namespace: str, name: str = "") -> str:
    base = f"/apis/coordination.k8s.io/v1/namespaces/{quote(namespace, safe='')}/leases"
    return f"{base}/{quote(name, safe='')}" if name else base


def micro_time(at: datetime | None = None) -> str:
    """A MicroTime as the API writes it: RFC 3339 with microseconds, UTC."""
    return (at or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_lease(obj: dict[str, Any]) -> Lease:
    spec = field(obj, "spec")
    duration = spec.get("leaseDurationSeconds")
    transitions = spec.get("leaseTransitions")
    return Lease(
        holder=str(spec.get("holderIdentity") or ""),
        duration_seconds=duration if isinstance(duration, int) and not isinstance(duration, bool) else 0,
        transitions=transitions if isinstance(transitions, int) and not isinstance(transitions, bool) else 0,
        acquire_time=str(spec.get("acquireTime") or ""),
        resource_version=str(field(obj, "metadata").get("resourceVersion", "")),
        instance=str(field(field(obj, "metadata"), "annotations").get(INSTANCE_ANNOTATION) or ""),
        routes=_routes(field(field(obj, "metadata"), "annotations").get(ROUTES_ANNOTATION)),
    )


def _routes(text: object) -> frozenset[str] | None:
    """ROUTES_ANNOTATION as written by write_lease; None (unknown) for anything else, whoever wrote it."""
    try:
        routes = json.loads(text) if isinstance(text, str) else None
    except (ValueError, RecursionError):  # RecursionError: nested deeper than the parser recurses (`[[[...`)
        return None
    if not isinstance(routes, list) or not all(isinstance(route, str) for route in routes):
        return None
    return frozenset(routes)


async def get_lease(client: KubeClient, namespace: str, name: str) -> Lease | None:
    """The Lease, or None when there is none."""
    try:
        _, obj = await client.request("GET", lease_path(namespace, name))
    except KubeAPIError as err:
        if err.status == 404:
            return None
        raise
    return parse_lease(obj)


async def write_lease(
    client: KubeClient,
    namespace: str,
    name: str,
    holder: str,
    instance: str,
    duration_seconds: int,
    previous: Lease | None,
    routes: frozenset[str] = frozenset(),
) -> Lease:
    """Make `holder` (the process `instance`) the holder (or, with holder "", give the lease up), renewed now.

    `previous` is the Lease as read: None creates it; otherwise the update carries its resourceVersion, so a
    change made since (another replica took or renewed it) is a 409 KubeAPIError and nothing is written.
    """
    now = micro_time()
    # Renewing, or giving up (holder ""), is no transition; taking it from another holder (or none) is one.
    kept = previous is not None and (previous.holder == holder or holder == "")
    spec: dict[str, Any] = {
        "holderIdentity": holder,
        "leaseDurationSeconds": duration_seconds,
        "renewTime": now,
        "acquireTime": previous.acquire_time if kept and previous is not None else now,
        "leaseTransitions": (previous.transitions + (0 if kept else 1)) if previous is not None else 0,
    }
    annotations = {INSTANCE_ANNOTATION: instance, ROUTES_ANNOTATION: json.dumps(sorted(routes))}
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "annotations": annotations}
    body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata, "spec": spec}
    if previous is None:
        _, obj = await client.request("POST", lease_path(namespace), body)
    else:
        metadata["resourceVersion"] = previous.resource_version
        _, obj = await client.request("PUT", lease_path(namespace, name), body)
    return parse_lease(obj)
