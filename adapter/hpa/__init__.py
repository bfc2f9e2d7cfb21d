"""The HPA replica calculation, v1.37 semantics (docs/protocols.md#hpa-algorithm), for `zeroscale explain` and
`zeroscale demo`.

Pure and clock-injected: `HorizontalController(spec).sync(now, ...)` returns a `Decision`.
Never used by the serving path.
"""

from adapter.hpa.controller import HorizontalController, MetricFailure, MetricReading
from adapter.hpa.decision import Decision, MetricResult
from adapter.hpa.manifest import HPAManifest, ManifestError, load_manifests, parse_manifests
from adapter.hpa.spec import HPASpec

__all__ = [
    "Decision",
    "HPAManifest",
    "HPASpec",
    "HorizontalController",
    "ManifestError",
    "MetricFailure",
    "MetricReading",
    "MetricResult",
    "load_manifests",
    "parse_manifests",
]
