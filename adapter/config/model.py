"""The whole configuration: one YAML file plus `ZEROSCALE_` environment overrides."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from adapter.config.delegate import DelegateConfig
from adapter.config.grpc import GRPCConfig
from adapter.config.http import HTTPMetric, HTTPSource
from adapter.config.kafka import KafkaMetric, KafkaSource
from adapter.config.proxy import ProxyConfig
from adapter.config.redis import RedisMetric, RedisSource
from adapter.config.server import CacheConfig, ServerConfig
from adapter.config.static import StaticMetric, StaticSource
from adapter.config.tracing import TracingConfig

# Each queue system adds its pair of models here; `type` picks the member.
SourceConfig = Annotated[StaticSource | RedisSource | KafkaSource | HTTPSource, Field(discriminator="type")]
MetricConfig = Annotated[StaticMetric | RedisMetric | KafkaMetric | HTTPMetric, Field(discriminator="type")]


class ZeroscaleConfig(BaseSettings):
    """The configuration file's top level; every key may also be set as `ZEROSCALE_<SECTION>__<KEY>`."""

    model_config = SettingsConfigDict(
        env_prefix="ZEROSCALE_",
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
        use_attribute_docstrings=True,
    )

    server: ServerConfig = Field(default_factory=ServerConfig)
    """The external metrics API (`zeroscale serve`): listeners, TLS, authentication and connection limits."""
    cache: CacheConfig = Field(default_factory=CacheConfig)
    """How series are read from their sources and kept warm."""
    proxy: ProxyConfig = Field(default_factory=ProxyConfig)
    """The buffering proxy (`zeroscale proxy`): listeners, connection defences and routes."""
    grpc: GRPCConfig = Field(default_factory=GRPCConfig)
    """The two gRPC servers: KEDA's external scaler (in `serve`) and the pending-count stream (in `proxy`)."""
    sources: list[SourceConfig] = Field(default_factory=list)
    """The queue systems to read, each named; `type` picks the kind."""
    metrics: list[MetricConfig] = Field(default_factory=list)
    """The external metrics served, each read from a source of its type."""
    tracing: TracingConfig = Field(default_factory=TracingConfig)
    """OpenTelemetry traces of the proxy's requests and the adapter's answers (off by default)."""
    delegate: DelegateConfig | None = None
    """Another external metrics API server answering the metric names not in `metrics` (adapter/api/delegate.py)."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The environment wins over the file (passed as init values); no .env files, no secrets dir:
        # secrets are files named in the config.
        return (env_settings, init_settings)

    def source_named(self, name: str) -> Any:
        return next((source for source in self.sources if source.name == name), None)
