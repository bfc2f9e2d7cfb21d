"""Host and path -> route: exact host first, then the longest `*.suffix`, then `*`; within it, longest path prefix."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Generic, TypeVar

T = TypeVar("T")

_MAX_CACHED_HOSTS = 4096


def normalise_host(host: bytes) -> bytes:
    """Lower case, without the port (also for `[v6]:port`) and without a trailing dot."""
    host = host.strip().lower()
    if host.startswith(b"["):
        end = host.find(b"]")
        host = host[: end + 1] if end != -1 else host
    else:
        colon = host.rfind(b":")
        if colon != -1:
            host = host[:colon]
    return host.rstrip(b".")


class Router(Generic[T]):
    """Routes are (hosts, path prefix, value); `match` is called once per request, so host lookups are cached."""

    def __init__(self, routes: Iterable[tuple[list[str], str, T]]) -> None:
        self._exact: dict[bytes, list[tuple[bytes, T]]] = {}
        self._wildcard: list[tuple[bytes, list[tuple[bytes, T]]]] = []
        self._any: list[tuple[bytes, T]] = []
        wildcards: dict[bytes, list[tuple[bytes, T]]] = {}
        for hosts, prefix, value in routes:
            entry = (prefix.encode(), value)
            for host in hosts:
                pattern = host.lower().encode()
                if pattern == b"*":
                    self._any.append(entry)
                elif pattern.startswith(b"*."):
                    wildcards.setdefault(pattern[1:], []).append(entry)
                else:
                    self._exact.setdefault(pattern, []).append(entry)
        # Longest suffix first, so `*.a.example.com` wins over `*.example.com`.
        self._wildcard = sorted(wildcards.items(), key=lambda item: -len(item[0]))
        for table in (*self._exact.values(), *(entries for _, entries in self._wildcard), self._any):
            table.sort(key=lambda entry: -len(entry[0]))
        self._by_host: dict[bytes, list[tuple[bytes, T]] | None] = {}

    def _candidates(self, raw_host: bytes) -> list[tuple[bytes, T]] | None:
        """The routes for a host not yet in the cache (match looks there first)."""
        host = normalise_host(raw_host)
        entries = self._exact.get(host)
        if entries is None:
            entries = next((table for suffix, table in self._wildcard if host.endswith(suffix)), None)
        if entries is None and self._any:
            entries = self._any
        # The cache is bounded: hosts come from clients, and a client may send any number of them.
        if len(self._by_host) < _MAX_CACHED_HOSTS:
            self._by_host[raw_host] = entries
        return entries

    def match(self, host: bytes, path: bytes) -> T | None:
        """The route for a Host header (as sent) and a request path, or None (the proxy answers 404 itself)."""
        by_host = self._by_host
        entries = by_host[host] if host in by_host else self._candidates(host)
        if entries is None:
            return None
        for prefix, value in entries:
            if path.startswith(prefix) and (
                len(path) == len(prefix) or prefix.endswith(b"/") or path[len(prefix)] in b"/?"
            ):
                return value
        return None
