"""Settings of `zeroscale serve`: listening, TLS and authentication of the external metrics API."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from adapter.config.base import Duration, Strict
from adapter.config.kube import KubeAPIConfig


class ServingTLSConfig(Strict):
    """Certificate and key files (reloaded when they change), or a self-signed pair made at start."""

    cert_file: Path | None = None
    """The serving certificate (PEM); unset, with key_file unset: a self-signed pair made at start."""
    key_file: Path | None = None
    """The serving certificate's private key (PEM)."""
    self_signed_sans: list[str] = Field(default_factory=lambda: ["localhost", "127.0.0.1"])
    """The names and addresses a self-signed certificate carries."""
    min_version: Literal["1.2", "1.3"] = "1.2"
    """The oldest TLS version accepted."""
    reload_interval: Duration = 10.0
    """How often certificate and CA files are checked for changes on disk."""


class RequestHeaderConfig(Strict):
    """Front-proxy (aggregator) client-certificate authentication, docs/protocols.md#front-proxy-auth.

    With `client_ca_file` unset, the CA and names are read and watched from the
    `kube-system/extension-apiserver-authentication` ConfigMap.
    """

    client_ca_file: Path | None = None
    """The CA of the front proxy's client certificates; unset: read from the ConfigMap."""
    allowed_names: list[str] = Field(default_factory=list)
    """The common names a front proxy's certificate may carry; empty: any the CA signed."""
    username_headers: list[str] = Field(default_factory=lambda: ["X-Remote-User"])
    """Headers carrying the user's name."""
    uid_headers: list[str] = Field(default_factory=lambda: ["X-Remote-Uid"])
    """Headers carrying the user's UID."""
    group_headers: list[str] = Field(default_factory=lambda: ["X-Remote-Group"])
    """Headers carrying the user's groups."""
    extra_headers_prefix: list[str] = Field(default_factory=lambda: ["X-Remote-Extra-"])
    """Prefixes of headers carrying the user's extra attributes."""
    from_configmap: bool = True
    """Read the CA and these settings from `kube-system/extension-apiserver-authentication` when client_ca_file is
    unset."""


class AuthConfig(Strict):
    """Authentication is on by default; off is accepted only when every listener is on loopback."""

    enabled: bool = True
    """Authenticate and authorize every request; off is accepted only when every listener is on loopback."""
    request_header: RequestHeaderConfig = Field(default_factory=RequestHeaderConfig)
    """Front-proxy (aggregator) client-certificate authentication."""
    client_ca_file: Path | None = None
    """CA for ordinary client certificates (the cluster's `client-ca-file`), optional."""
    token_review: bool = True
    """Authenticate bearer tokens with a TokenReview."""
    always_allow_groups: list[str] = Field(default_factory=lambda: ["system:masters"])
    """Users in these groups are allowed without a SubjectAccessReview."""
    allow_cache_ttl: Duration = 10.0
    """How long an allowing SubjectAccessReview answer is reused."""
    deny_cache_ttl: Duration = 10.0
    """How long a denying SubjectAccessReview answer is reused."""
    token_cache_ttl: Duration = 10.0
    """How long a TokenReview answer is reused."""
    cache_size: int = Field(default=10_000, ge=1)
    """Answers kept in each of those caches."""
    max_token_reviews: int = Field(default=64, ge=1)
    """TokenReviews in flight at once (one per distinct token); past it a bearer token is answered 429."""
    max_access_reviews: int = Field(default=64, ge=1)
    """SubjectAccessReviews in flight at once (one per user and request); past it a request is answered 429."""
    kubernetes: KubeAPIConfig = Field(default_factory=KubeAPIConfig)
    """How to reach the Kubernetes API for TokenReviews, SubjectAccessReviews and the authentication ConfigMap."""


class ServerConfig(Strict):
    bind: str = "0.0.0.0"
    """The address the external metrics API listens on."""
    port: int = Field(default=6443, ge=0, le=65535)
    """The external metrics API's port (HTTPS)."""
    metrics_bind: str = "0.0.0.0"
    """The address of the plain HTTP listener for health and /metrics."""
    metrics_port: int = Field(default=8080, ge=0, le=65535)
    """That listener's port."""
    tls: ServingTLSConfig = Field(default_factory=ServingTLSConfig)
    """The serving certificate."""
    auth: AuthConfig = Field(default_factory=AuthConfig)
    """Who may call the API."""
    max_header_bytes: int = Field(default=16_384, ge=1024)
    """The largest request head (431 beyond)."""
    max_body_bytes: int = Field(default=65_536, ge=0)
    """No route takes a body; one is read (and dropped) up to this size, within body_timeout (408 after)."""
    max_buffered_bytes: int = Field(default=65_536, ge=1024)
    """Requests read ahead of their answers (pipelining), per connection: reading pauses beyond it."""
    max_connections: int = Field(default=4096, ge=1)
    """Counted from accept, TLS handshakes included."""
    metrics_max_connections: int = Field(default=256, ge=1)
    """The plain metrics port (health and /metrics) has its own, smaller budget."""
    max_connections_per_source: int = Field(default=512, ge=1)
    """One source address's share of each budget: one peer cannot take the connections the aggregator, the kubelet's
    probes or Prometheus need (the aggregator opens one connection per concurrent request)."""
    metrics_max_connections_per_source: int = Field(default=32, ge=1)
    """One source address's share of metrics_max_connections."""
    header_timeout: Duration = Field(default=10.0, gt=0)
    """The TLS handshake, then each request head."""
    body_timeout: Duration = Field(default=30.0, gt=0, le=60)
    """From a request's head to its body's last byte (408 beyond)."""
    response_timeout: Duration = Field(default=60.0, gt=0)
    """From a complete request to its answer handed to the socket."""
    idle_timeout: Duration = Field(default=120.0, gt=0)
    """A keep-alive connection with no request for this long is closed."""


class CacheConfig(Strict):
    """Defaults for every series; a metric may override `interval` and `max_staleness`."""

    interval: Duration = 5.0
    """How often each series is read from its source (a metric may set its own)."""
    max_staleness: Duration = 60.0
    """A read whose last good value is older than this is answered 503 (a metric may set its own)."""
    idle_ttl: Duration = 600.0
    """A series asked by nobody for this long is dropped from the cache."""
    unwatch_after: Duration = Field(default=30.0, gt=0)
    """A series asked by nobody for this long (and not subscribed) is no longer followed by its source (a Kafka group
    stops being polled, Redis notifications for its keys are dropped) until it is asked again; longer while its asks
    have a period and the next one is not yet half an interval late. Twice the HPA's default sync period: its second ask
    comes within it."""
    query_timeout: Duration = 10.0
    """The longest one source query may take; then it counts as failed."""
    push_interval: Duration = Field(default=0.25, ge=0.1, le=60)
    """Pushed changes refresh a series at most once per this long: a queue written to without pause (any producer) would
    otherwise make one read per source round trip. Above the schedule's 50 ms coalescing. Not the edge from zero: a
    change to a series at 0 (or below activation_threshold) is read at once (docs/architecture.md#edge-from-zero), at
    most once more per this long."""
    max_series: int = Field(default=10_000, ge=1)
    """Series kept in the cache at most; reads of a new series beyond are refused."""
    max_series_per_namespace: int = Field(default=1_000, ge=1)
    """One namespace's share of max_series: a caller who may read one namespace cannot fill the table."""
