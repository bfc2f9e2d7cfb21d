"""The `static` source: serves the values written in the config file."""

from __future__ import annotations

from adapter.config.static import StaticSource
from adapter.sources.base import Sample, Source, SourceError, SourceQuery


class StaticValues(Source):
    def __init__(self, config: StaticSource) -> None:
        super().__init__()
        self._series = config.series

    async def query(self, query: SourceQuery) -> list[Sample]:
        samples = [Sample(s.value, s.labels) for s in self._series if query.selector.matches(s.labels)]
        if not samples:
            raise SourceError(f"no static series matches the selector {str(query.selector)!r}")
        return samples
