"""The `http` source: requests held or in flight in the buffering proxies, summed over every proxy replica.

The adapter subscribes to each proxy's pending-count stream (grpc.counts on the proxy). Replicas are
found by DNS (every address of one or more headless Services, re-resolved periodically) or listed statically.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from adapter.config.base import Duration, MetricBase, SelectorLabel, SourceBase, TLSClientFiles, split_address


class HTTPSource(SourceBase):
    type: Literal["http"]
    """`http`: the requests held or in flight in the buffering proxies."""
    dns: str | list[str] | None = None
    """host:port of a headless Service (every A/AAAA record is one proxy replica), e.g.
    `zeroscale-proxy-counts.zeroscale.svc.cluster.local:9091`; or a list of them, e.g. the cluster proxies' and the
    headless Service of an app's sidecars (route mode activator): every address of every name is one replica."""
    proxies: list[str] = Field(default_factory=list)
    """Or fixed host:port addresses, one per replica."""
    resolve_interval: Duration = Field(default=5.0, gt=0)
    """How often the dns names are resolved again."""
    stale_after: Duration = Field(default=5.0, gt=0)
    """Until a replica has sent nothing (not even a heartbeat) for this long, its last counts stay in the sum: a blip in
    the connection does not make requests vanish. After it, a replica discovery still lists fails the read (its counts
    are unknown, not zero); one discovery no longer lists drops out."""
    max_count: int = Field(default=10**9, ge=1, le=10**12)
    """A count above this (or below 0) is a broken or hostile replica: it fails the metric until it sends sane counts
    again. Far above any real backlog, far below int64 overflow when summed."""
    coalesce: Duration = 0.005
    """A replica's updates closer together than this are applied as one (the newest), except one that lifts a route from
    0 (applied at once, once per interval beside: docs/architecture.md#edge-from-zero), so a replica flooding updates
    costs at most two applies per interval."""
    tls: TLSClientFiles | None = None
    """TLS towards the proxies' counts servers; unset: plaintext."""
    tls_server_name: str | None = None
    """Name to check in the proxies' certificate (replicas are dialled by IP address)."""
    reconnect_min: Duration = 0.05
    """The first wait before reconnecting to a replica; it doubles on each failure up to reconnect_max."""
    reconnect_max: Duration = 2.0
    """The longest wait between reconnects."""
    keepalive_time: Duration = 10.0
    """An idle connection to a replica is pinged this often."""
    keepalive_timeout: Duration = 5.0
    """A ping unanswered this long closes the connection."""
    max_message_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    """A snapshot larger than this is refused by gRPC before it is decoded (max_routes keys `<namespace>/<name>` of up
    to 317 characters fit): decoding costs CPU per message, whoever sends it."""
    max_routes: int = Field(default=10_000, ge=1)
    """Routes in one replica's snapshot; more is a broken or hostile replica: it fails the metric. A replica lists only
    the routes holding or forwarding something now, so this bounds busy routes, not configured ones; the default is the
    most route objects one proxy serves (proxy.route_objects.max_routes), all busy at once."""
    max_replicas: int = Field(default=256, ge=1)
    """Replicas discovery may list; more fails the metric (each one is a channel and a task here)."""

    @field_validator("proxies")
    @classmethod
    def _addresses(cls, proxies: list[str]) -> list[str]:
        for address in proxies:
            split_address(address)
        return proxies

    @model_validator(mode="after")
    def _one_discovery(self) -> HTTPSource:
        if (not self.dns_names()) == (not self.proxies):
            raise ValueError(
                "set exactly one of dns (headless Service host:port, or a list of them) and proxies (host:port list)"
            )
        for name in self.dns_names():
            split_address(name)
        if self.tls is not None and not self.tls.verify_hostname:
            raise ValueError("gRPC always checks the proxies' certificate name: set tls_server_name instead")
        return self

    def dns_names(self) -> list[str]:
        """The headless Services' host:port names discovery resolves (none with a fixed `proxies` list)."""
        if self.dns is None:
            return []
        return [self.dns] if isinstance(self.dns, str) else list(self.dns)


def _route_label() -> dict[str, SelectorLabel]:
    return {"route": SelectorLabel(pattern=r"[a-z0-9]([-a-z0-9_.]*[a-z0-9])?", required=True)}


class HTTPMetric(MetricBase):
    """Requests of one route (selector `route=<name>`, or `route in (a,b)` for a sum) over every replica.

    An HPA (or ScaledObject) in namespace A reads the routes of A only: `route=web` is route `A/web` (counts are
    keyed `<namespace>/<name>`). No value names another namespace's route: a label value cannot hold `/` (the
    selector grammar refuses it, whatever `labels.route.pattern` says).
    """

    type: Literal["http"]
    """`http`: read from an `http` source."""
    count: Literal["pending", "held", "inflight"] = "pending"
    """pending = held + in flight: the requests that need a ready replica."""
    labels: dict[str, SelectorLabel] = Field(default_factory=_route_label)
    """The selector labels: exactly one, `route`, required."""

    @model_validator(mode="after")
    def _route_required(self) -> HTTPMetric:
        route = self.labels.get("route")
        if route is None or not route.required or len(self.labels) != 1:
            raise ValueError("an http metric has exactly one selector label, route, and it is required")
        return self
