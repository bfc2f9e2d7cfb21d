"""The `redis` source: list, sorted-set and stream depths on a standalone server, Sentinel or Cluster."""

from __future__ import annotations

from string import Template
from typing import Literal

from pydantic import Field, model_validator

from adapter.config.base import (
    Duration,
    MetricBase,
    SecretFile,
    SourceBase,
    Strict,
    TLSClientFiles,
    credential_in_url,
    split_address,
)


def _check_addresses(addresses: list[str], where: str) -> None:
    for address in addresses:
        split_address(address)  # raises ValueError with the offending text
    if not addresses:
        raise ValueError(f"{where} needs at least one host:port")


class RedisSentinel(Strict):
    """Sentinels to ask for the current master of `master_name`."""

    addresses: list[str]
    """The Sentinels, as `host:port`."""
    master_name: str
    """The name the Sentinels know the master by."""
    username: SecretFile | None = None
    """Sentinels often have their own password (`requirepass` in sentinel.conf); unset: none."""
    password: SecretFile | None = None
    """The Sentinels' password, from a file; unset: none."""

    @model_validator(mode="after")
    def _valid(self) -> RedisSentinel:
        _check_addresses(self.addresses, "sentinel.addresses")
        return self


class RedisSource(SourceBase):
    """Connection to one Redis deployment; exactly one of `url`, `sentinel` and `cluster_nodes` is set."""

    type: Literal["redis"]
    """`redis`: a Redis server, Sentinel set or Cluster."""
    url: str | None = None
    """Standalone: redis://host:port (or rediss:// for TLS). Put credentials in the files below, not here."""
    sentinel: RedisSentinel | None = None
    """Sentinel: the Sentinels to ask for the current master."""
    cluster_nodes: list[str] = Field(default_factory=list)
    """Cluster: a few seed nodes; the rest of the topology is discovered."""
    db: int = Field(default=0, ge=0)
    """The database number (standalone and Sentinel)."""
    username: SecretFile | None = None
    """ACL user (Redis 6+) and password, each read from a file."""
    password: SecretFile | None = None
    """The password, from a file."""
    tls: TLSClientFiles | None = None
    """TLS towards Redis: CA, client certificate, hostname check (a `rediss://` url turns TLS on as well)."""
    connect_timeout: Duration = 5.0
    """The longest a connection may take to open."""
    timeout: Duration = 5.0
    """The longest one command may take."""
    max_connections: int = Field(default=16, ge=1)
    """Connections open to one server at most."""
    batch_window: Duration = 0.002
    """Reads arriving within this window go out together in one pipeline."""
    notifications: bool = False
    """Subscribe to keyspace notifications of the keys being read, to refresh at once on a change."""

    @model_validator(mode="after")
    def _one_mode(self) -> RedisSource:
        given = (("url", self.url), ("sentinel", self.sentinel), ("cluster_nodes", self.cluster_nodes))
        modes = [name for name, value in given if value]
        if len(modes) != 1:
            named = ", ".join(modes) or "none"
            raise ValueError(f"set exactly one of url (standalone), sentinel, cluster_nodes (given: {named})")
        if self.url is not None and not self.url.startswith(("redis://", "rediss://")):
            raise ValueError("url must start with redis:// or rediss://")
        found = credential_in_url(self.url) if self.url is not None else None
        if found is not None:
            raise ValueError(
                f"url must not hold a password ({found}): use password: {{file: ...}} (and username: {{file: ...}})"
            )
        if self.cluster_nodes:
            _check_addresses(self.cluster_nodes, "cluster_nodes")
            if self.db != 0:
                raise ValueError("Redis Cluster has only database 0; leave db unset")
        return self

    @property
    def mode(self) -> Literal["standalone", "sentinel", "cluster"]:
        if self.sentinel is not None:
            return "sentinel"
        return "cluster" if self.cluster_nodes else "standalone"


RedisQueryKind = Literal["length", "zset_due", "stream_length", "stream_pending", "stream_lag", "stream_backlog"]
GROUP_QUERIES = ("stream_pending", "stream_lag", "stream_backlog")


# The placeholder a key or group template takes the asking namespace from (an HPA's, a ScaledObject's), not a label.
NAMESPACE = "namespace"


def placeholders(template: str) -> list[str]:
    """Names used as `$name` / `${name}` in a key or group template."""
    return list(Template(template).get_identifiers())


class RedisMetric(MetricBase):
    """One queue depth. `redis_key` and `group` are templates filled from the HPA's selector.

    `${key}` takes the value(s) of the selector label `key`; `rq:queue:${queue}` adds a prefix
    (label values cannot hold `:`); a template without `$` is a fixed key. Several values
    (`key in (a,b)`) read every combination and sum them. `${namespace}` is the namespace asking
    (the HPA's, the ScaledObject's), not a label: `${namespace}:jobs:${queue}` keeps each team
    to its own keys.
    """

    type: Literal["redis"]
    """`redis`: read from a `redis` source."""
    query: RedisQueryKind
    """What is read: length (a list), zset_due (sorted-set members due by now), stream_length, and for a consumer group
    stream_pending, stream_lag or stream_backlog."""
    redis_key: str = "${key}"
    """The key, a template filled from the selector's labels (`${key}`, `${namespace}`)."""
    group: str | None = None
    """The consumer group of a group query, a template as redis_key."""
    score_unit: Literal["seconds", "milliseconds"] = "seconds"
    """zset_due: the unit of the scores (the due time as a Unix timestamp)."""

    @model_validator(mode="after")
    def _templates(self) -> RedisMetric:
        if self.query in GROUP_QUERIES and self.group is None:
            raise ValueError(f"query {self.query} needs group (a consumer group name, or a template like ${{group}})")
        if self.query not in GROUP_QUERIES and self.group is not None:
            raise ValueError(f"query {self.query} reads no consumer group; remove group")
        for field_name, template in (("redis_key", self.redis_key), ("group", self.group)):
            if template is None:
                continue
            if not Template(template).is_valid():
                raise ValueError(f"{field_name}: not a valid template; write $$ for a literal $")
            for name in placeholders(template):
                if name == NAMESPACE:
                    if NAMESPACE in self.labels:
                        raise ValueError(
                            f"{field_name} uses ${{{NAMESPACE}}}, the namespace asking: rename the selector label "
                            f"{NAMESPACE!r}"
                        )
                    continue
                label = self.labels.get(name)
                if label is None:
                    raise ValueError(
                        f"{field_name} uses ${{{name}}} but the metric declares no selector label {name!r} "
                        f"(add labels: {{{name}: {{pattern: ..., required: true}}}})"
                    )
                if not label.required:
                    raise ValueError(f"{field_name} uses ${{{name}}}: mark the label {name!r} required: true")
        return self
