"""Settings of the two gRPC servers: KEDA's external scaler (in `serve`) and the pending-count stream (in `proxy`).

Both are off until enabled. Without `tls` a server speaks plaintext, which is allowed only on a
loopback address unless `allow_plaintext: true` says the network is trusted (DESIGN rule 4).
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


class GRPCServerConfig(Strict):
    enabled: bool = False
    bind: str = "0.0.0.0"
    port: int = Field(default=9443, ge=0, le=65535)
    tls: GRPCServerTLS | None = None
    # Plaintext on a non-loopback address: only inside a network you trust.
    allow_plaintext: bool = False
    # Server pings an idle connection this often and closes it when no answer comes within the timeout.
    keepalive_time: Duration = 30.0
    keepalive_timeout: Duration = 10.0
    # Clients may ping at most this often (KEDA and our adapter ping every 10 s or more).
    min_client_ping_interval: Duration = 5.0
    # Concurrent long-lived streams on this server; one more is refused with RESOURCE_EXHAUSTED.
    max_streams: int = Field(default=1000, ge=1)
    # HTTP/2 streams per connection.
    max_concurrent_streams: int = Field(default=100, ge=1)
    max_message_bytes: int = Field(default=1024 * 1024, ge=1024)
    # A stream with nothing new to say still sends a message this often, so a silent peer is noticed.
    heartbeat_interval: Duration = Field(default=5.0, gt=0)

    @property
    def address(self) -> str:
        host = f"[{self.bind}]" if ":" in self.bind else self.bind
        return f"{host}:{self.port}"


class ScalerServerConfig(GRPCServerConfig):
    """KEDA's `external` / `external-push` triggers connect here (scalerAddress)."""

    port: int = Field(default=9443, ge=0, le=65535)


class CountsServerConfig(GRPCServerConfig):
    """Each proxy replica serves its per-route counts here; the adapter's `http` source subscribes."""

    port: int = Field(default=9091, ge=0, le=65535)
    heartbeat_interval: Duration = Field(default=1.0, gt=0)
    # Changes closer together than this go out as one message.
    coalesce: Duration = 0.002


class GRPCConfig(Strict):
    scaler: ScalerServerConfig = Field(default_factory=ScalerServerConfig)
    counts: CountsServerConfig = Field(default_factory=CountsServerConfig)

    @model_validator(mode="after")
    def _plaintext_only_on_loopback(self) -> GRPCConfig:
        for name, server in (("scaler", self.scaler), ("counts", self.counts)):
            if server.enabled and server.tls is None and not server.allow_plaintext and not is_loopback(server.bind):
                raise ValueError(
                    f"grpc.{name}: without tls the server binds only to loopback; "
                    f"set grpc.{name}.tls, bind: 127.0.0.1, or allow_plaintext: true inside a trusted network"
                )
        return self
