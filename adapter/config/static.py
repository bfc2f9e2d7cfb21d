"""The `static` source: values written in the config file, for trying the whole path without a queue."""

from __future__ import annotations

from decimal import Decimal
from typing import Literal

from pydantic import Field

from adapter.config.base import MetricBase, SourceBase, Strict


class StaticSeries(Strict):
    labels: dict[str, str] = Field(default_factory=dict)
    value: Decimal


class StaticSource(SourceBase):
    type: Literal["static"]
    series: list[StaticSeries] = Field(default_factory=list)


class StaticMetric(MetricBase):
    """Sums the source's series whose labels match the HPA's selector."""

    type: Literal["static"]
