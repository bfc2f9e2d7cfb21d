"""Host, path and headers -> route, by one precedence rule (docs/architecture.md#route-precedence): the most specific
host rule (exact, then the longest `*.suffix`, then `*`); within it the longest path prefix, then the route with more
header conditions, then claim order. A route whose prefix or headers do not match falls through to the next one of
its host rule; never to a less specific host rule."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

T = TypeVar("T")

_MAX_CACHED_HOSTS = 4096
_OWS = b" \t"
_NOT_SENT = (0, b"")

# A route's header conditions: (lowered name, value) pairs, by name.
Conditions = tuple[tuple[bytes, bytes], ...]
# A request's headers as the client end parsed them: names as sent (HTTP/1.1) or lower case (HTTP/2).
Headers = Sequence[tuple[bytes, bytes]]
_Entry = tuple[bytes, Conditions, T]


class Claim(Protocol):
    """What a route claims of the requests: a route's config (adapter/config/route.py) is one."""

    @property
    def hosts(self) -> Sequence[str]: ...
    @property
    def path_prefix(self) -> str: ...
    @property
    def match_headers(self) -> Mapping[str, str]: ...


@dataclass(frozen=True)
class Match:
    """A claim spelled out: an activator route's own port takes every request (`Match()`), and tests."""

    hosts: Sequence[str] = ("*",)
    path_prefix: str = "/"
    match_headers: Mapping[str, str] = field(default_factory=dict)


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


def conditions_of(match_headers: Mapping[str, str]) -> Conditions:
    """A route's `match_headers` as the router compares them: names lowered, values as field values (no surrounding
    spaces or tabs; latin-1, one byte per character, as the config model admits them)."""
    return tuple(
        sorted(
            (name.lower().encode("ascii"), value.strip(" \t").encode("latin-1"))
            for name, value in match_headers.items()
        )
    )


def header_index(headers: Headers) -> dict[bytes, tuple[int, bytes]]:
    """A request's headers by lowered name: how many times each was sent, and its last value. `Router.match` builds
    it once per request, when the first candidate with conditions is tried, so a route's conditions cost a lookup
    each, whatever the number of routes and headers."""
    index: dict[bytes, tuple[int, bytes]] = {}
    for key, value in headers:
        name = key.lower()
        index[name] = (index.get(name, _NOT_SENT)[0] + 1, value)
    return index


def unmet(conditions: Conditions, index: Mapping[bytes, tuple[int, bytes]]) -> tuple[bytes, int, bytes] | None:
    """The first condition the request's headers (`header_index`) do not meet, as (name, how many times it was sent,
    the value sent last), or None when all are met. A condition is met by a header sent exactly once with that value:
    a header sent twice is a list of values, not the one value the route asked for (and a proxy before this one may
    have joined or split it), so it never matches."""
    for name, wanted in conditions:
        times, sent = index.get(name, _NOT_SENT)
        if times != 1 or sent.strip(_OWS) != wanted:
            return name, times, sent
    return None


def at_boundary(prefix: bytes, path: bytes) -> bool:
    """`path` starts with `prefix` at a `/` boundary (`/api` takes `/api`, `/api/x`, `/api?q`, not `/apix`).
    `Router.match` inlines this (the hot path); the dry run and the tests call it."""
    return path.startswith(prefix) and (len(path) == len(prefix) or prefix.endswith(b"/") or path[len(prefix)] in b"/?")


@dataclass(frozen=True)
class Step(Generic[T]):
    """One candidate as the router tried it, in order: what the dry run prints (adapter/proxy/dry_run.py)."""

    value: T
    prefix: bytes
    conditions: Conditions
    prefix_matches: bool
    # The first header condition not met (name, times sent, value sent), None when all are (or the prefix failed).
    unmet: tuple[bytes, int, bytes] | None

    @property
    def takes(self) -> bool:
        return self.prefix_matches and self.unmet is None


class Router(Generic[T]):
    """Routes are (claim, value), in claim order; `match` is called once per request, so host lookups are cached."""

    def __init__(self, routes: Iterable[tuple[Claim, T]]) -> None:
        self._exact: dict[bytes, list[_Entry[T]]] = {}
        self._any: list[_Entry[T]] = []
        wildcards: dict[bytes, list[_Entry[T]]] = {}
        for claim, value in routes:
            entry = (claim.path_prefix.encode(), conditions_of(claim.match_headers), value)
            for host in claim.hosts:
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
            # Stable: routes of equal prefix and as many conditions stay in claim order.
            table.sort(key=lambda entry: (-len(entry[0]), -len(entry[1])))
        self._by_host: dict[bytes, list[_Entry[T]] | None] = {}

    def host_rule(self, host: bytes) -> tuple[str, list[_Entry[T]]] | None:
        """The host rule a request's Host meets (the exact host, `*.suffix` or `*`) and its routes, best first."""
        host = normalise_host(host)
        entries = self._exact.get(host)
        if entries is not None:
            return host.decode("latin-1"), entries
        for suffix, table in self._wildcard:
            if host.endswith(suffix):
                return "*" + suffix.decode("latin-1"), table
        return ("*", self._any) if self._any else None

    def _candidates(self, raw_host: bytes) -> list[_Entry[T]] | None:
        """The routes for a host not yet in the cache (match looks there first)."""
        rule = self.host_rule(raw_host)
        entries = rule[1] if rule is not None else None
        # The cache is bounded: hosts come from clients, and a client may send any number of them. It holds what the
        # host alone decides (headers are looked at per request), so an entry is right for every request to it.
        if len(self._by_host) < _MAX_CACHED_HOSTS:
            self._by_host[raw_host] = entries
        return entries

    def match(self, host: bytes, path: bytes, headers: Headers) -> T | None:
        """The route for a Host header (as sent), a request path and its headers, or None (the proxy answers 404
        itself). Headers are read only for a route with header conditions: without any, routing costs what it did."""
        by_host = self._by_host
        entries = by_host[host] if host in by_host else self._candidates(host)
        if entries is None:
            return None
        index = None
        for prefix, conditions, value in entries:
            # at_boundary, inlined: docs/architecture.md#hot-skipped-calls
            if path.startswith(prefix) and (
                len(path) == len(prefix) or prefix.endswith(b"/") or path[len(prefix)] in b"/?"
            ):
                if not conditions:
                    return value
                if index is None:
                    index = header_index(headers)
                if unmet(conditions, index) is None:
                    return value
        return None

    def explain(self, host: bytes, path: bytes, headers: Headers) -> tuple[str | None, list[Step[T]]]:
        """What `match` does, step by step: the host rule met (None: none, the 404), and the candidates tried in
        order up to the one that takes the request (the last step, when one does)."""
        rule = self.host_rule(host)
        if rule is None:
            return None, []
        steps: list[Step[T]] = []
        index = header_index(headers)
        for prefix, conditions, value in rule[1]:
            prefix_matches = at_boundary(prefix, path)
            missing = unmet(conditions, index) if prefix_matches else None
            steps.append(Step(value, prefix, conditions, prefix_matches, missing))
            if steps[-1].takes:
                break
        return rule[0], steps
