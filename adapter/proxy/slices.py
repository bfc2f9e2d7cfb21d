"""The EndpointSlices the routes read, one watch per namespace however many routes read Services there.

A watch per route would make 10,000 routes 10,000 watches of the API server (each a connection, a list at start and
after every silence or 410), when a handful of namespaces hold their Services: so each namespace with a route
reading slices has one list-and-watch of all its slices (the loop of adapter/kube/watching.py, with its staleness
bound), and each change goes to the routes reading the Service the slice belongs to (its
`kubernetes.io/service-name` label) alone. The watch of a namespace starts with its first reader and stops with its
last.

`discovery.k8s.io/v1` is asked first; a server without it (404, before v1.21) is asked `v1beta1`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from adapter.kube.client import KubeClient
from adapter.kube.endpointslices import API_VERSIONS, SERVICE_NAME_LABEL
from adapter.kube.errors import KubeAPIError, KubeError
from adapter.kube.watching import ListWatch, field, objects_by_name

log = logging.getLogger(__name__)

# A reader gets the Service's slices by name after each change of them (and once when they are first listed).
SlicesReader = Callable[[dict[str, dict[str, Any]]], None]
# Told when the API said no or went away (the slices last seen stay); returns True to stop reading for good.
FailureReader = Callable[[KubeError], bool]


class _Reader:
    __slots__ = ("failed", "read")

    def __init__(self, read: SlicesReader, failed: FailureReader) -> None:
        self.read = read
        self.failed = failed


class NamespaceSlices:
    """Every EndpointSlice of one namespace, by Service, for the routes reading them."""

    def __init__(self, kube: KubeClient, namespace: str) -> None:
        self.namespace = namespace
        self._kube = kube
        self._readers: dict[str, list[_Reader]] = {}  # by Service name
        self._by_service: dict[str, dict[str, dict[str, Any]]] = {}  # Service -> its slices by name
        self._service_of: dict[str, str] = {}  # slice name -> its Service, as last seen
        self._listed = False
        self.watch = ListWatch(
            kube, self._list, f"EndpointSlice watch of namespace {namespace}", self._changed, self._failed
        )

    @property
    def readers(self) -> int:
        return sum(len(readers) for readers in self._readers.values())

    def add(self, service: str, reader: _Reader) -> None:
        self._readers.setdefault(service, []).append(reader)
        if self._listed:  # a late reader gets what is known at once, as a first list would give it
            reader.read(dict(self._by_service.get(service, {})))

    def remove(self, service: str, reader: _Reader) -> None:
        readers = self._readers.get(service, [])
        if reader in readers:
            readers.remove(reader)
        if not readers:
            self._readers.pop(service, None)

    async def _list(self) -> tuple[str, dict[str, dict[str, Any]], str]:
        for api_version in API_VERSIONS:
            path = f"/apis/{api_version}/namespaces/{self.namespace}/endpointslices"
            try:
                _, listing = await self._kube.request("GET", path)
            except KubeAPIError as err:
                if err.status == 404 and api_version != API_VERSIONS[-1]:
                    continue
                raise
            return path, objects_by_name(listing), str(field(listing, "metadata").get("resourceVersion", ""))
        raise AssertionError("unreachable: the last version re-raises")

    def _changed(self, slices: dict[str, dict[str, Any]]) -> None:
        name = self.watch.changed_key
        if name is None:  # a list: every Service may have changed
            self._listed = True
            before = set(self._by_service)
            self._by_service, self._service_of = {}, {}
            for each, body in slices.items():
                self._file(each, body)
            # Every reader hears a list, a Service without a slice too: "none ready" is then known, not unknown.
            touched = before | set(self._by_service) | set(self._readers)
        else:
            touched = {service for service in (self._service_of.pop(name, None),) if service is not None}
            self._unfile(name, touched)
            now = slices.get(name)
            if now is not None:
                touched.add(self._file(name, now))
        for service in touched:
            readers = self._readers.get(service)
            if readers:
                current = self._by_service.get(service, {})
                for reader in list(readers):
                    reader.read(dict(current))

    def _file(self, name: str, body: dict[str, Any]) -> str:
        service = str(field(field(body, "metadata"), "labels").get(SERVICE_NAME_LABEL) or "")
        self._service_of[name] = service
        self._by_service.setdefault(service, {})[name] = body
        return service

    def _unfile(self, name: str, services: set[str]) -> None:
        for service in services:
            held = self._by_service.get(service)
            if held is not None:
                held.pop(name, None)
                if not held:
                    del self._by_service[service]

    def _failed(self, err: KubeError) -> bool:
        for service, readers in list(self._readers.items()):
            for reader in list(readers):
                if reader.failed(err):
                    self.remove(service, reader)
        return False  # the namespace's watch goes on for the readers left (it stops with its last one)


class SliceWatches:
    """The namespaces' slice watches, shared by every route of this proxy."""

    def __init__(self, kube: KubeClient) -> None:
        self._kube = kube
        self._namespaces: dict[str, NamespaceSlices] = {}
        self._stopping: set[asyncio.Task[None]] = set()

    @property
    def namespaces(self) -> list[str]:
        """The namespaces watched now."""
        return list(self._namespaces)

    def read(self, namespace: str, service: str, read: SlicesReader, failed: FailureReader) -> SliceSubscription:
        """Give `read` the slices of Service `namespace/service` after each change, until the subscription closes."""
        watch = self._namespaces.get(namespace)
        if watch is None:
            watch = self._namespaces[namespace] = NamespaceSlices(self._kube, namespace)
            watch.watch.start()
        reader = _Reader(read, failed)
        watch.add(service, reader)
        return SliceSubscription(self, watch, service, reader)

    def release(self, watch: NamespaceSlices, service: str, reader: _Reader) -> None:
        watch.remove(service, reader)
        if watch.readers == 0 and self._namespaces.get(watch.namespace) is watch:
            del self._namespaces[watch.namespace]
            task = asyncio.get_running_loop().create_task(watch.watch.close())
            self._stopping.add(task)
            task.add_done_callback(self._stopping.discard)

    async def close(self) -> None:
        for watch in self._namespaces.values():
            await watch.watch.close()
        self._namespaces.clear()
        await asyncio.gather(*self._stopping, return_exceptions=True)


class SliceSubscription:
    """One route's reading of one Service's slices: `relist()` reads the namespace again, `close()` stops reading."""

    def __init__(self, owner: SliceWatches, watch: NamespaceSlices, service: str, reader: _Reader) -> None:
        self._owner = owner
        self._watch = watch
        self._service = service
        self._reader = reader

    async def relist(self) -> None:
        await self._watch.watch.relist()

    async def close(self) -> None:
        self._owner.release(self._watch, self._service, self._reader)
