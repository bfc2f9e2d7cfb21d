"""Settings of the two gRPC servers: KEDA's external scaler (in `serve`) and the pending-count stream (in `proxy`).

Both are off until enabled. Without `tls` a server speaks plaintext, which is allowed only on a
loopback address unless `allow_plaintext: true` says the network is trusted (docs/architecture.md#secure-by-default).
Without `tls.client_ca_file` nobody is authenticated, which is allowed only on a loopback address unless
`allow_unauthenticated: true` says so. (gRPC's Python servers either require a verified client
certificate or ask for none: there is no "optional" in between.)
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator

from adapter.config.base import Duration, Strict, is_loopback


class GRPCServerTLS(Strict):
    """Certificate and key files, re-read when they change; `client_ca_file` turns on mutual TLS."""

    cert_file: Path
    key_file: Path
    # Clients must present a certificate signed by one of these CAs.
    client_ca_file: Path | None = None
    # How often the files are checked for changes (new connections get the new certificate).
    reload_interval: Duration = 10.0
    # Only client certificates naming one of these (a subjectAltName DNS name, or the common name of a
    # certificate without subjectAltNames) may call; others get PERMISSION_DENIED. Empty: any
    # certificate client_ca_file signed. One CA signs every part of an installation, so without it
    # KEDA's certificate would open the counts port and the adapter's the scaler.
    client_names: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _names_need_a_ca(self) -> GRPCServerTLS:
        if self.client_names and self.client_ca_file is None:
            raise ValueError("client_names needs client_ca_file: without client certificates there is no name")
        return self


class GRPCServerConfig(Strict):
    enabled: bool = False
    bind: str = "0.0.0.0"
    port: int = Field(default=9443, ge=0, le=65535)
    tls: GRPCServerTLS | None = None
    # Plaintext on a non-loopback address: only inside a network you trust.
    allow_plaintext: bool = False
    # No client certificate required on a non-loopback address: anyone who can connect may call.
    allow_unauthenticated: bool = False
    # Server pings an idle connection this often and closes it when no answer comes within the timeout.
    keepalive_time: Duration = 30.0
    keepalive_timeout: Duration = 10.0
    # Clients may ping at most this often (KEDA and our adapter ping every 10 s or more).
    min_client_ping_interval: Duration = 5.0
    # Open connections, counted from accept; gRPC closes one more at once.
    max_connections: int = Field(default=256, ge=1)
    # From accept to the client's HTTP/2 SETTINGS (TLS handshake and preface included). Our clients
    # (KEDA, the adapter) take milliseconds; a silent connection holds a place under max_connections
    # for this long. gRPC has no per-address cap for connections not yet authenticated: the
    # NetworkPolicies are what keep strangers from the port (docs/reference/security.md).
    handshake_timeout: Duration = Field(default=5.0, gt=0)
    # A connection with no call open for this long is closed (clients reconnect when they need to).
    idle_timeout: Duration = Field(default=120.0, gt=0)
    # Every connection is told to go (HTTP/2 GOAWAY) at this age, and closed `max_connection_age_grace`
    # later with whatever it still has open: the one deadline for a call whose request never comes, and
    # for a peer opening and resetting streams without end. Clients reconnect at once; streams resume.
    max_connection_age: Duration = Field(default=1800.0, gt=0)
    max_connection_age_grace: Duration = Field(default=30.0, gt=0)
    # Concurrent long-lived streams on this server (health watches included); one more is refused
    # with RESOURCE_EXHAUSTED.
    max_streams: int = Field(default=1000, ge=1)
    # Streams one peer (its address, or IPv6 /64, and certificate identity) may hold, so no one peer
    # starves the others.
    max_streams_per_peer: int = Field(default=100, ge=1)
    # HTTP/2 streams per connection.
    max_concurrent_streams: int = Field(default=100, ge=1)
    # The largest message a client may send; every request here is a few hundred bytes.
    max_message_bytes: int = Field(default=64 * 1024, ge=1024)
    # A stream with nothing new to say still sends a message this often, so a silent peer is noticed.
    heartbeat_interval: Duration = Field(default=5.0, gt=0)

    @property
    def address(self) -> str:
        host = f"[{self.bind}]" if ":" in self.bind else self.bind
        return f"{host}:{self.port}"

    @property
    def verifies_clients(self) -> bool:
        return self.tls is not None and self.tls.client_ca_file is not None

    @property
    def client_names(self) -> frozenset[str]:
        """The certificate names allowed to call; empty when any verified certificate may."""
        return frozenset(self.tls.client_names) if self.tls is not None else frozenset()


class ScalerServerConfig(GRPCServerConfig):
    """KEDA's `external` / `external-push` triggers connect here (scalerAddress)."""

    port: int = Field(default=9443, ge=0, le=65535)
    # KEDA is one peer holding a stream per external-push ScaledObject (and StreamMetricSpec): below
    # max_streams, so one peer never holds them all. More push ScaledObjects: raise both.
    max_streams_per_peer: int = Field(default=500, ge=1)
    # All scalerMetadata keys and values of one request together; the same bound as the HTTP API's
    # server.max_header_bytes, checked before anything is parsed.
    max_metadata_bytes: int = Field(default=16_384, ge=1024)
    # A trigger reads its ScaledObject's namespace. True lets scalerMetadata.namespace name another one:
    # then anyone who may create a ScaledObject reads every namespace's series through KEDA, and the
    # series count against the namespace read (cache.max_series_per_namespace).
    allow_namespace_override: bool = False


class CountsServerConfig(GRPCServerConfig):
    """Each proxy replica serves its per-route counts here; the adapter's `http` source subscribes."""

    port: int = Field(default=9091, ge=0, le=65535)
    heartbeat_interval: Duration = Field(default=1.0, gt=0)
    # An adapter holds one stream per `http` source that lists this replica.
    max_streams_per_peer: int = Field(default=16, ge=1)
    # Changes closer together than this go out as one message, except one that lifts a route from 0: at once,
    # once per interval beside (docs/architecture.md#edge-from-zero).
    coalesce: Duration = 0.002


class GRPCConfig(Strict):
    scaler: ScalerServerConfig = Field(default_factory=ScalerServerConfig)
    counts: CountsServerConfig = Field(default_factory=CountsServerConfig)

    def unauthenticated(self) -> list[str]:
        """A warning for each enabled server off loopback that lets peers without a client certificate call."""
        warnings = []
        for name, server in (("scaler", self.scaler), ("counts", self.counts)):
            exposed = server.enabled and not is_loopback(server.bind)
            if exposed and server.allow_unauthenticated and not server.verifies_clients:
                warnings.append(
                    f"grpc.{name}: no client certificates (allow_unauthenticated: true) on {server.bind}: "
                    "anyone who can connect may call it; set tls.client_ca_file and remove allow_unauthenticated"
                )
        return warnings

    @model_validator(mode="after")
    def _exposed_only_when_said(self) -> GRPCConfig:
        for name, server in (("scaler", self.scaler), ("counts", self.counts)):
            if not server.enabled or is_loopback(server.bind):
                continue
            if server.tls is None and not server.allow_plaintext:
                raise ValueError(
                    f"grpc.{name}: without tls the server binds only to loopback; "
                    f"set grpc.{name}.tls, bind: 127.0.0.1, or allow_plaintext: true inside a trusted network"
                )
            if not server.verifies_clients and not server.allow_unauthenticated:
                raise ValueError(
                    f"grpc.{name}: without client certificates anyone who reaches {server.bind} may call; "
                    f"set grpc.{name}.tls.client_ca_file, bind: 127.0.0.1, or allow_unauthenticated: true"
                )
        return self
