"""EndpointSlices of one Service (docs/protocols.md#endpointslices): list and watch them, and read which endpoints may
take traffic.

`discovery.k8s.io/v1` is asked first; a server that does not serve it (404, before v1.21) is asked
`discovery.k8s.io/v1beta1`, whose endpoints carry the same `addresses`, `conditions` and `ports`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from typing import Any
from urllib.parse import quote

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


async def watch_slices(client: KubeClient, path: str, resource_version: str) -> AsyncIterator[dict[str, Any]]:
    """The events after `resource_version`, until the server ends the watch; 410 Gone raises KubeAPIError."""
    async for event in client.watch(path, resource_version or None):
        yield event


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


def ready_addresses(slices: Iterable[dict[str, Any]], port: str | int) -> list[tuple[str, int]]:
    """Addresses that may take traffic, per docs/protocols.md#endpointslices.

    Usable: `ready` nil or true, and not `terminating`. Only when no endpoint is usable, endpoints
    that are terminating but still `serving` are used, so held requests drain into them.
    """
    usable: list[tuple[str, int]] = []
    serving: list[tuple[str, int]] = []
    for slice_obj in slices:
        number = _port_of(slice_obj, port)
        if number is None:
            continue
        for endpoint in items_of(slice_obj, "endpoints"):
            conditions = field(endpoint, "conditions")
            ready = conditions.get("ready")
            terminating = conditions.get("terminating") is True
            is_serving = conditions.get("serving")
            if is_serving is None:
                is_serving = ready in (None, True)
            addresses = [(address, number) for address in items_of(endpoint, "addresses") if isinstance(address, str)]
            if ready in (None, True) and not terminating:
                usable.extend(addresses)
            elif is_serving:
                serving.extend(addresses)
    return usable or serving
