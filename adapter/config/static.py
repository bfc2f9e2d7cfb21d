"""The `static` source: values written in the config file, for trying the whole path without a queue."""

from __future__ import annotations

from decimal import Decimal
from typing import Literal

from pydantic import Field

from adapter.config.base import MetricBase, SourceBase, Strict


class StaticSeries(Strict):
    labels: dict[str, str] = Field(default_factory=dict)
    """The series' labels, matched against the HPA's selector."""
    value: Decimal
    """Its value."""


class StaticSource(SourceBase):
    type: Literal["static"]
    """`static`: values written in this file."""
    series: list[StaticSeries] = Field(default_factory=list)
    """The series and their values."""


class StaticMetric(MetricBase):
    """Sums the source's series whose labels match the HPA's selector."""

    type: Literal["static"]
    """`static`: read from a `static` source."""
