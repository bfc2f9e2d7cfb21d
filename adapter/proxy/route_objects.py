"""ZeroscaleRoute objects kept current: listed and watched across the namespaces served (one watch for all of them,
or one per namespace when proxy.route_objects.namespaces names them), each parsed once per generation.

The watches are the one loop of adapter/kube/watching.py: relisted whenever a watch ends, and taken for dead when
the stream falls silent longer than kubernetes.watch_silence_timeout (docs/architecture.md#staleness-bounds).
Without the CRD the lists fail (404): the routes of the config file serve alone, and the lists are retried with
the loop's back-off, so installing the CRD later needs no restart.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from adapter.config.proxy import RouteObjectsConfig
from adapter.config.route import RouteConfig
from adapter.config.route_object import GROUP, PLURAL, VERSION, parse_route
from adapter.kube.client import KubeClient
from adapter.kube.errors import KubeAPIError, KubeError
from adapter.kube.watching import ListWatch, collection_lister, field, namespaced_name_of
from adapter.proxy.claims import Refusal

log = logging.getLogger(__name__)
# A failing list is logged at most this often (it is retried far more often).
_FAILURE_LOG_INTERVAL = 60.0


@dataclass(frozen=True)
class RouteObject:
    """One object as the control plane uses it: what it declares (or why it declares nothing usable)."""

    key: str  # <namespace>/<name>
    generation: int
    created: str  # metadata.creationTimestamp: the claim's age
    config: RouteConfig | None
    invalid: Refusal | None
    status: dict[str, Any]  # as last read: the writer keeps what did not change (lastTransitionTime)


def collection_paths(config: RouteObjectsConfig) -> list[str]:
    base = f"/apis/{GROUP}/{VERSION}"
    if not config.namespaces:
        return [f"{base}/{PLURAL}"]
    return [f"{base}/namespaces/{namespace}/{PLURAL}" for namespace in config.namespaces]


class RouteObjects:
    """The route objects of every namespace served, parsed, kept up to date one event at a time: `on_change()` after
    each list and each event that changed one, and `take_changes()` says which (so 10,000 routes cost one object per
    event, not 10,000: most events are the status writer's own writes)."""

    def __init__(self, kube: KubeClient, config: RouteObjectsConfig, on_change: Callable[[], None]) -> None:
        self._on_change = on_change
        self._keys: dict[str, set[str]] = {}  # per collection path: the keys of its objects
        self._parsed: dict[str, RouteObject] = {}
        self._changed_keys: set[str] = set()  # since the last take_changes()
        self._specs_changed = False  # an object added, deleted, or of a new generation since then
        self._failure_logged_at = -_FAILURE_LOG_INTERVAL
        self.listed = False  # every collection listed at least once
        self.absent = False  # the API server answered 404: the CRD is not installed (until a list succeeds)
        self._watches = {
            path: ListWatch(
                kube,
                collection_lister(kube, path, namespaced_name_of),
                f"ZeroscaleRoute watch {path}",
                lambda objects, path=path: self._changed(path, objects),  # type: ignore[misc]
                self._failed,
                key=namespaced_name_of,
                shape=_what_is_read,
            )
            for path in collection_paths(config)
        }

    def start(self) -> None:
        for watch in self._watches.values():
            watch.start()

    async def close(self) -> None:
        for watch in self._watches.values():
            await watch.close()

    def objects(self) -> list[RouteObject]:
        """Every route object seen, parsed (once per generation: a status write does not parse it again)."""
        return list(self._parsed.values())

    def get(self, key: str) -> RouteObject | None:
        return self._parsed.get(key)

    def take_changes(self) -> tuple[set[str], bool]:
        """The keys changed since the last call, and whether any spec changed (an object added, deleted or of a new
        generation) rather than only statuses."""
        changed, specs = self._changed_keys, self._specs_changed
        self._changed_keys, self._specs_changed = set(), False
        return changed, specs

    def _parse(self, key: str, obj: dict[str, Any]) -> RouteObject:
        metadata = field(obj, "metadata")
        generation = metadata.get("generation")
        generation = generation if isinstance(generation, int) else 0
        created = str(metadata.get("creationTimestamp") or "0")  # never "": that is a file route's age
        status = field(obj, "status")
        known = self._parsed.get(key)
        if known is not None and known.generation == generation and known.created == created:
            return known if known.status == status else _with_status(known, status)
        try:
            config, invalid = parse_route(obj), None
        except ValueError as err:
            config, invalid = None, Refusal("InvalidSpec", str(err))
        return RouteObject(key, generation, created, config, invalid, status)

    def _changed(self, path: str, objects: dict[str, dict[str, Any]]) -> None:
        self.absent = False
        key = self._watches[path].changed_key
        keys = self._keys.setdefault(path, set())
        if key is None:  # a list: any object may have changed, and some may be gone
            for gone in keys - objects.keys():
                self._update(gone, None)
            keys.clear()
            keys.update(objects)
            for each, obj in objects.items():
                self._update(each, obj)
        else:
            changed = objects.get(key)
            if changed is None:
                keys.discard(key)
            else:
                keys.add(key)
            self._update(key, changed)
        self.listed = len(self._keys) == len(self._watches)
        self._on_change()

    def _update(self, key: str, obj: dict[str, Any] | None) -> None:
        before = self._parsed.get(key)
        after = None if obj is None else self._parse(key, obj)
        if after is before:
            return
        if after is None:
            del self._parsed[key]
        else:
            self._parsed[key] = after
        self._changed_keys.add(key)
        if before is None or after is None or before.generation != after.generation or before.created != after.created:
            self._specs_changed = True

    def _failed(self, err: KubeError) -> bool:
        self.absent = self.absent or (isinstance(err, KubeAPIError) and err.status == 404 and not self._keys)
        now = time.monotonic()
        if now >= self._failure_logged_at + _FAILURE_LOG_INTERVAL:
            self._failure_logged_at = now
            hint = (
                " (is the ZeroscaleRoute CRD installed? `kubectl apply --server-side -f deploy/helm/zeroscale/crds/`)"
                if isinstance(err, KubeAPIError) and err.status == 404
                else ""
            )
            log.warning("cannot read ZeroscaleRoute objects%s; serving the last seen: %s", hint, err)
        return False


# What the proxy reads of a route object's metadata; the rest (annotations, labels, managedFields: up to the API's
# 1.5 MB an object, written by the tenant) is dropped as it arrives, so a team's objects cost the shared proxy their
# spec, not whatever else they carry.
_METADATA_READ = ("name", "namespace", "generation", "creationTimestamp", "resourceVersion", "uid")


def _what_is_read(obj: dict[str, Any]) -> dict[str, Any]:
    metadata = field(obj, "metadata")
    kept: dict[str, Any] = {"metadata": {key: metadata[key] for key in _METADATA_READ if key in metadata}}
    for part in ("spec", "status"):
        if part in obj:
            kept[part] = obj[part]
    return kept


def _with_status(known: RouteObject, status: dict[str, Any]) -> RouteObject:
    return RouteObject(known.key, known.generation, known.created, known.config, known.invalid, status)
