"""The catalogue: which metrics exist, and how an HPA's request becomes a source query."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from adapter.config.base import MetricBase, SelectorLabel
from adapter.k8s_wire.selector import Selector, SelectorError, parse_selector
from adapter.metrics.errors import BadSelector, MetricNotFound
from adapter.sources.base import SourceQuery

# A namespace name as Kubernetes validates it: a DNS-1123 label.
_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
# Parts of a selector (requirements and set values: what commas separate) read at most. An HPA's selector
# has a few; a 16 KB one of thousands of requirements costs tens of milliseconds of event loop to parse,
# so it is refused by a count in C before any parsing (its requirements are ANDed: each is one label).
MAX_SELECTOR_PARTS = 256


def namespace_problem(namespace: str) -> str | None:
    """Why `namespace` is not a name Kubernetes allows (answered 400), or None. Every caller's namespace,
    HTTP or gRPC, is checked: each distinct one takes a share of the series table."""
    if _NAMESPACE.fullmatch(namespace):
        return None
    return (
        f"invalid namespace {namespace!r}: a namespace is a DNS-1123 label (lower-case letters, digits "
        "and '-', starting and ending with a letter or digit, at most 63 characters)"
    )


# The longest metric name read: a DNS-1123 subdomain's length (an HPA's names are far shorter). The name
# keys the review caches, so an unbounded one would let any authenticated caller park 16 KB per entry there.
MAX_METRIC_NAME = 253


def metric_name_problem(name: str) -> str | None:
    """Why `name` (percent-decoded) cannot be a metric's name (answered 400 before any review), or None: what
    Kubernetes allows in a path segment (not `.`, `..`, nothing with `/` or `%`), printable, of bounded length."""
    if (
        0 < len(name) <= MAX_METRIC_NAME
        and name not in (".", "..")
        and name.isprintable()
        and not {"/", "%"} & set(name)
    ):
        return None
    return (
        f"invalid metric name {name[:64]!r}: a metric name is 1 to {MAX_METRIC_NAME} printable characters, "
        "without '/' or '%', and not '.' or '..'"
    )


@dataclass(frozen=True)
class SeriesKey:
    """One series: what the cache keeps warm and refreshes in the background."""

    metric: str
    namespace: str
    selector: str


class Catalogue:
    def __init__(self, metrics: Sequence[MetricBase]) -> None:
        self._metrics = {metric.key: metric for metric in metrics}

    def names(self) -> list[str]:
        """Metric names as discovery lists them: lower case, as the HPA asks for them."""
        return sorted(self._metrics)

    def metric(self, name: str) -> MetricBase:
        found = self._metrics.get(name.lower())
        if found is None:
            raise MetricNotFound(f"the server could not find the metric {name} for namespaces")
        return found

    def resolve(self, name: str, namespace: str, selector_text: str) -> tuple[SeriesKey, SourceQuery]:
        """Check a request against the metric's declared labels and patterns; raise MetricError."""
        problem = namespace_problem(namespace)
        if problem is not None:
            raise BadSelector(problem)
        metric = self.metric(name)
        if metric.namespaces and namespace not in metric.namespaces:
            raise MetricNotFound(f"the server could not find the metric {name} for namespace {namespace}")
        if selector_text.count(",") >= MAX_SELECTOR_PARTS:
            raise BadSelector(
                f"label selector has more than {MAX_SELECTOR_PARTS} requirements and set values; "
                "a metric's selector names each of its labels at most once"
            )
        try:
            selector = parse_selector(selector_text)
        except SelectorError as err:
            raise BadSelector(str(err)) from None
        _check_labels(metric, selector, namespace)
        params = {key: values for key in metric.labels if (values := selector.values_for(key)) is not None}
        key = SeriesKey(metric.key, namespace, str(selector))
        return key, SourceQuery(metric=metric, params=params, selector=selector, namespace=namespace)


def _check_labels(metric: MetricBase, selector: Selector, namespace: str) -> None:
    """Every value the selector names is one its label's pattern allows for `namespace` (`{namespace}` in a
    pattern is the asking namespace); raise BadSelector otherwise."""
    declared = metric.labels
    for requirement in selector.requirements:
        allowed = declared.get(requirement.key)
        if allowed is None:
            names = ", ".join(sorted(declared)) or "none"
            raise BadSelector(
                f"label {requirement.key!r} is not a selector label of metric {metric.name} "
                f"(its labels: {names}); declare it under metrics[].labels to allow it"
            )
        # Every operand, a `>`/`<` bound included, is a value the label may take: each distinct one is a series.
        for value in requirement.values:
            if not allowed.allows(value, namespace):
                raise BadSelector(
                    f"value {value!r} of label {requirement.key!r} does not match the pattern "
                    f"{allowed.pattern!r} that metric {metric.name} allows{_as_bound(allowed, namespace)}"
                )
    for key, label in declared.items():
        if label.required and selector.values_for(key) is None:
            raise BadSelector(f"metric {metric.name} needs the selector to give {key} (e.g. {key}=<value>)")


def _as_bound(label: SelectorLabel, namespace: str) -> str:
    """How a pattern naming `{namespace}` read for this request, for the 400's message."""
    bound = label.bound(namespace)
    return "" if bound == label.pattern else f" in namespace {namespace} (there: {bound!r})"
