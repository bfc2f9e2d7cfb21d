"""Configuration: pydantic models for one YAML file plus `ZEROSCALE_` environment overrides."""

from adapter.config.loader import CONFIG_ENV, ConfigError, load_config
from adapter.config.model import MetricConfig, SourceConfig, ZeroscaleConfig

__all__ = ["CONFIG_ENV", "ConfigError", "MetricConfig", "SourceConfig", "ZeroscaleConfig", "load_config"]
