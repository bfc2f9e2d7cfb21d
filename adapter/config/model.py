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

# Each queue system adds its pair of models here; `type` picks the member.
SourceConfig = Annotated[StaticSource | RedisSource | KafkaSource | HTTPSource, Field(discriminator="type")]
MetricConfig = Annotated[StaticMetric | RedisMetric | KafkaMetric | HTTPMetric, Field(discriminator="type")]


class ZeroscaleConfig(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="ZEROSCALE_",
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
    )

    server: ServerConfig = Field(default_factory=ServerConfig)
    cache: CacheConfig = Field(default_factory=CacheConfig)
    proxy: ProxyConfig = Field(default_factory=ProxyConfig)
    grpc: GRPCConfig = Field(default_factory=GRPCConfig)
    sources: list[SourceConfig] = Field(default_factory=list)
    metrics: list[MetricConfig] = Field(default_factory=list)
    # Another external metrics API server answering the metric names not in `metrics` (adapter/api/delegate.py).
    delegate: DelegateConfig | None = None

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
