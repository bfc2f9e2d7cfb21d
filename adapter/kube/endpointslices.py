"""EndpointSlices of one Service (docs/protocols.md#endpointslices): list and watch them, and read which endpoints may
take traffic.

`discovery.k8s.io/v1` is asked first; a server that does not serve it (404, before v1.21) is asked
`discovery.k8s.io/v1beta1`, whose endpoints carry the same `addresses`, `conditions` and `ports`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any
from urllib.parse import quote

from adapter.k8s_wire.endpoint_ip import LOOPBACK, endpoint_refusal
from adapter.kube.client import KubeClient
from adapter.kube.errors import KubeAPIError
from adapter.kube.watching import field, items_of, objects_by_name

API_VERSIONS = ("discovery.k8s.io/v1", "discovery.k8s.io/v1beta1")


def slices_path(api_version: str, namespace: str, service: str) -> str:
    selector = quote(f"kubernetes.io/service-name={service}", safe="")
    return f"/apis/{api_version}/namespaces/{namespace}/endpointslices?labelSelector={selector}"


async def list_slices(client: KubeClient, namespace: str, service: str) -> tuple[str, dict[str, dict[str, Any]], str]:
    """(collection path, slices by name, the list's resourceVersion), trying v1 then v1beta1."""
    for api_version in API_VERSIONS:
        path = slices_path(api_version, namespace, service)
        try:
            _, listing = await client.request("GET", path)
        except KubeAPIError as err:
            if err.status == 404 and api_version != API_VERSIONS[-1]:
                continue
            raise
        items = objects_by_name(listing)
        return path, items, str((listing.get("metadata") or {}).get("resourceVersion", ""))
    raise AssertionError("unreachable: the last version re-raises")


def _port_of(slice_obj: dict[str, Any], port: str | int) -> int | None:
    """The endpoint port for the Service port name (or, given a number, that number if the slice has it)."""
    for entry in items_of(slice_obj, "ports"):
        number = entry.get("port") if isinstance(entry, dict) else None
        if not isinstance(number, int) or isinstance(number, bool):
            continue
        if isinstance(port, int) and number == port:
            return int(number)
        if isinstance(port, str) and (entry.get("name") or "") == port:
            return int(number)
    return None


def app_protocol(slices: Iterable[dict[str, Any]], port: str | int) -> str:
    """The `appProtocol` the slices give `port` (the Service port's, copied by the EndpointSlice controller); "" when
    none does. A Service at zero has no endpoints, and its slices then list no ports either: it is known once a pod
    is ready, which is when it is needed."""
    for slice_obj in slices:
        for entry in items_of(slice_obj, "ports"):
            if not isinstance(entry, dict):
                continue
            name, number = entry.get("name") or "", entry.get("port")
            if (name == port if isinstance(port, str) else number == port) and isinstance(
                entry.get("appProtocol"), str
            ):
                return str(entry["appProtocol"])
    return ""


def ready_addresses(
    slices: Iterable[dict[str, Any]], port: str | int, *, loopback: bool = False
) -> list[tuple[str, int]]:
    """Addresses that may take traffic (the rule of `routable`), each with its number of `port`."""
    groups = endpoints_by_port(slices, port, loopback=loopback)
    every = [(endpoint, number) for number, group in groups.items() for endpoint in group]
    chosen = [pair for pair in every if is_usable(pair[0])] or [pair for pair in every if is_serving(pair[0])]
    return [(address, number) for endpoint, number in chosen for address in endpoint["addresses"]]


def routable(endpoints: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The endpoints new traffic may go to, per docs/protocols.md#endpointslices: the usable ones; only when none
    is, those terminating but still serving, so held requests drain into them (as kube-proxy does)."""
    return [endpoint for endpoint in endpoints if is_usable(endpoint)] or [
        endpoint for endpoint in endpoints if is_serving(endpoint)
    ]


# --- the slices Zeroscale writes for a selector-less Service (route mode: activator) ---

SERVICE_NAME_LABEL = "kubernetes.io/service-name"
MANAGED_BY_LABEL = "endpointslice.kubernetes.io/managed-by"
# Our value of the managed-by label: Kubernetes' own controllers write endpointslice-controller.k8s.io and
# endpointslicemirroring-controller.k8s.io, and leave slices with other values alone, as we leave theirs.
MANAGED_BY = "activator.zeroscale.io"
ROUTE_LABEL = "zeroscale.io/route"
# The fields of an endpoint a written slice keeps (the rest, e.g. deprecated topology, is not copied).
_ENDPOINT_FIELDS = ("addresses", "conditions", "nodeName", "zone", "hints", "targetRef")


def owned_slices_path(namespace: str, service: str) -> str:
    """The collection of the slices we wrote for `service` (and only those: two labels select them)."""
    selector = quote(f"{SERVICE_NAME_LABEL}={service},{MANAGED_BY_LABEL}={MANAGED_BY}", safe="")
    return f"/apis/{API_VERSIONS[0]}/namespaces/{namespace}/endpointslices?labelSelector={selector}"


def slice_path(namespace: str, name: str = "") -> str:
    base = f"/apis/{API_VERSIONS[0]}/namespaces/{namespace}/endpointslices"
    return f"{base}/{name}" if name else base


def endpoints_by_port(
    slices: Iterable[dict[str, Any]], port: str | int, *, loopback: bool = False
) -> dict[int, list[dict[str, Any]]]:
    """The endpoints of the slices that have `port`, grouped by its number there (a rollout that changed a
    targetPort has two), each with only the fields a written slice keeps. Conditions are kept as they are."""
    groups: dict[int, list[dict[str, Any]]] = {}
    for slice_obj in slices:
        number = _port_of(slice_obj, port)
        if number is not None:
            groups.setdefault(number, []).extend(kept_endpoints(slice_obj, loopback=loopback))
    return {number: endpoints for number, endpoints in groups.items() if endpoints}


# Only IP endpoints (docs/architecture.md#only-ip-endpoints): kube-proxy routes IPv4 and IPv6 slices and ignores FQDN
# ones, whose names could resolve anywhere (`localhost`: the proxy's own pod); an address the API refuses in an IP
# slice is refused here too, loopback alone allowed with `loopback` (development, a stand-in of the API).
IP_ADDRESS_TYPES = ("IPv4", "IPv6")
FQDN_SLICE = "fqdn_slice"  # why an address of a slice of another addressType is refused


def kept_endpoints(slice_obj: dict[str, Any], *, loopback: bool = False) -> list[dict[str, Any]]:
    """A slice's endpoints that have an address that may be one, each with only the fields a written slice keeps;
    none of a slice that is not of IP addresses."""
    if slice_obj.get("addressType") not in IP_ADDRESS_TYPES:
        return []
    kept = []
    for endpoint in items_of(slice_obj, "endpoints"):
        addresses = [
            address
            for address in items_of(endpoint, "addresses")
            if isinstance(address, str) and refusal(address, loopback=loopback) is None
        ]
        if addresses:
            kept.append({**{key: endpoint[key] for key in _ENDPOINT_FIELDS if key in endpoint}, "addresses": addresses})
    return kept


def refusal(address: str, *, loopback: bool = False) -> str | None:
    """Why `address` may not be an endpoint, None when it may (loopback too, with `loopback`)."""
    why = endpoint_refusal(address)
    return None if why == LOOPBACK and loopback else why


def refused_addresses(slices: Iterable[dict[str, Any]], *, loopback: bool = False) -> set[tuple[str, str]]:
    """(address, why) of every address `kept_endpoints` leaves out of the slices."""
    refused = set()
    for slice_obj in slices:
        fqdn = slice_obj.get("addressType") not in IP_ADDRESS_TYPES
        for endpoint in items_of(slice_obj, "endpoints"):
            for address in items_of(endpoint, "addresses"):
                why = FQDN_SLICE if fqdn else refusal(str(address), loopback=loopback)
                if why is not None:
                    refused.add((str(address), why))
    return refused


def is_usable(endpoint: dict[str, Any]) -> bool:
    """May take new traffic: `ready` nil or true and not terminating (docs/protocols.md#endpointslices)."""
    conditions = field(endpoint, "conditions")
    return conditions.get("ready") in (None, True) and conditions.get("terminating") is not True


def is_serving(endpoint: dict[str, Any]) -> bool:
    """Still answers: `serving`, which defaults to what `ready` says when it is nil."""
    conditions = field(endpoint, "conditions")
    serving = conditions.get("serving")
    return conditions.get("ready") in (None, True) if serving is None else serving is True


def build_slices(
    namespace: str,
    service: str,
    route: str,
    owner: dict[str, Any] | None,
    port_name: str,
    groups: dict[int, list[dict[str, Any]]],
    per_slice: int,
) -> dict[str, dict[str, Any]]:
    """The slices (by name) that list `groups` for the Service, at most `per_slice` endpoints each; one empty
    slice when there is nothing to list (kube-proxy then refuses connections at once rather than timing out).
    `owner` is the Service's ownerReference: the slices go when the Service does."""
    labels = {SERVICE_NAME_LABEL: service, MANAGED_BY_LABEL: MANAGED_BY, ROUTE_LABEL: route}
    # One slice holds one address family (a dual-stack Service's pods come in a slice per family) and one port.
    chunks: list[tuple[str, int, list[dict[str, Any]]]] = []
    for number in sorted(groups):
        for family in ("IPv4", "IPv6"):
            endpoints = sorted(
                (ep for ep in groups[number] if _family(ep["addresses"][0]) == family),
                key=lambda endpoint: endpoint["addresses"],
            )
            chunks += [(family, number, endpoints[at : at + per_slice]) for at in range(0, len(endpoints), per_slice)]
    slices: dict[str, dict[str, Any]] = {}
    for index, (family, number, endpoints) in enumerate(chunks or [("IPv4", 0, [])]):
        name = f"{service}-zeroscale-{index}"
        metadata: dict[str, Any] = {"name": name, "namespace": namespace, "labels": labels}
        if owner is not None:
            metadata["ownerReferences"] = [owner]
        slices[name] = {
            "apiVersion": API_VERSIONS[0],
            "kind": "EndpointSlice",
            "metadata": metadata,
            "addressType": family,
            "ports": [{"name": port_name, "port": number, "protocol": "TCP"}] if endpoints else [],
            "endpoints": endpoints,
        }
    return slices


def _family(address: str) -> str:
    return "IPv6" if ":" in address else "IPv4"


def same_slice(written: dict[str, Any], wanted: dict[str, Any]) -> bool:
    """A slice as read back says what `wanted` says (the API adds defaults and metadata we do not compare)."""
    metadata = field(written, "metadata")
    return (
        metadata.get("labels") == wanted["metadata"]["labels"]
        and metadata.get("ownerReferences") == wanted["metadata"].get("ownerReferences")
        and written.get("addressType") == wanted["addressType"]
        and [(p.get("name", ""), p.get("port")) for p in items_of(written, "ports") if isinstance(p, dict)]
        == [(p["name"], p["port"]) for p in wanted["ports"]]
        and _comparable(items_of(written, "endpoints")) == _comparable(wanted["endpoints"])
    )


def _comparable(endpoints: list[Any]) -> list[tuple[tuple[str, ...], tuple[bool, bool, bool]]]:
    """Addresses and the three conditions, as the API reads them back (a missing condition defaults)."""
    result = []
    for endpoint in endpoints:
        conditions = field(endpoint, "conditions")
        ready = conditions.get("ready") in (None, True)
        result.append(
            (
                tuple(a for a in items_of(endpoint, "addresses") if isinstance(a, str)),
                (ready, conditions.get("serving", ready) is True, conditions.get("terminating") is True),
            )
        )
    return result
