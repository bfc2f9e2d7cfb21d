"""The metrics page in the format its scraper asks for: OpenMetrics when the `Accept` header names it (Prometheus does),
else Prometheus' classic text format, as before. Only OpenMetrics carries exemplars: the trace ids on the cold-start
histograms (docs/protocols.md#tracing).

Two formats, whatever the header says. prometheus_client's own choose_encoder echoes the client's `version` and
`escaping` parameters into the answer, so a page cached per answer (adapter/api/listeners.py) would be a page cached
per header a stranger sends.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from prometheus_client.openmetrics import exposition as openmetrics


@dataclass(frozen=True)
class Format:
    content_type: str
    render: Callable[[], bytes]


CLASSIC = Format(CONTENT_TYPE_LATEST, generate_latest)
OPENMETRICS = Format(openmetrics.CONTENT_TYPE_LATEST, partial(openmetrics.generate_latest, REGISTRY))
_OPENMETRICS_TYPE = "application/openmetrics-text"


def negotiate(accept: str | None) -> Format:
    """OpenMetrics if `accept` lists its media type (and not with q=0, "not acceptable"), else the classic format.
    Linear in the header's length, which the listener bounds."""
    for media_range in (accept or "").split(","):
        kind, *parameters = media_range.split(";")
        if kind.strip().lower() == _OPENMETRICS_TYPE and not _refused(parameters):
            return OPENMETRICS
    return CLASSIC


def _refused(parameters: list[str]) -> bool:
    for parameter in parameters:
        name, _, value = parameter.partition("=")
        if name.strip().lower() == "q":
            try:
                return float(value) == 0.0
            except ValueError:
                return False  # a malformed weight is ignored, not taken as a refusal
    return False
