"""The parts of an autoscaling/v2 HorizontalPodAutoscaler spec the replica calculation reads.

Plain frozen dataclasses, already defaulted the way the API server stores them
(v2 defaults.go): manifest.py builds them, controller.py reads them.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from adapter.k8s_wire.selector import Operator, Requirement, Selector

MAX_INT32 = 2**31 - 1


class TargetType(StrEnum):
    VALUE = "Value"
    AVERAGE_VALUE = "AverageValue"


class PolicyType(StrEnum):
    PODS = "Pods"
    PERCENT = "Percent"


class SelectPolicy(StrEnum):
    MAX = "Max"
    MIN = "Min"
    DISABLED = "Disabled"


@dataclass(frozen=True)
class MetricTarget:
    type: TargetType
    milli: int  # target.value / target.averageValue MilliValue(): what the HPA divides by
    text: str  # the Quantity as written, for display


@dataclass(frozen=True)
class SelectorRequirement:
    """One `matchExpressions` entry: operator is In, NotIn, Exists or DoesNotExist."""

    key: str
    operator: str
    values: tuple[str, ...] = ()


_OPERATORS = {
    "In": Operator.IN,
    "NotIn": Operator.NOT_IN,
    "Exists": Operator.EXISTS,
    "DoesNotExist": Operator.DOES_NOT_EXIST,
}


@dataclass(frozen=True)
class LabelSelector:
    """A metav1.LabelSelector (`metric.selector`)."""

    match_labels: tuple[tuple[str, str], ...] = ()
    match_expressions: tuple[SelectorRequirement, ...] = ()

    def query(self) -> str:
        """`LabelSelectorAsSelector(s).String()`: the `labelSelector` the HPA sends (docs/protocols.md#em-list-call)."""
        requirements = [Requirement(key, Operator.EQUALS, (value,)) for key, value in self.match_labels]
        requirements += [
            Requirement(r.key, _OPERATORS[r.operator], tuple(sorted(set(r.values)))) for r in self.match_expressions
        ]
        return str(Selector(tuple(requirements)))

    def go_repr(self) -> str:
        """How Go's `%+v` prints the selector inside HPA error messages (docs/protocols.md#em-errors)."""
        labels = "".join(f"{key}: {value}," for key, value in sorted(self.match_labels))
        expressions = "".join(
            f"LabelSelectorRequirement{{Key:{r.key},Operator:{r.operator},Values:[{' '.join(r.values)}],}},"
            for r in self.match_expressions
        )
        return (
            f"&LabelSelector{{MatchLabels:map[string]string{{{labels}}},"
            f"MatchExpressions:[]LabelSelectorRequirement{{{expressions}}},}}"
        )


def selector_go_repr(selector: LabelSelector | None) -> str:
    return "nil" if selector is None else selector.go_repr()


def selector_query(selector: LabelSelector | None) -> str:
    """Both a nil and an empty selector serialize to "" (the parameter is then omitted)."""
    return "" if selector is None else selector.query()


@dataclass(frozen=True)
class ObjectReference:
    kind: str
    name: str
    api_version: str = ""


@dataclass(frozen=True)
class ExternalMetric:
    name: str
    selector: LabelSelector | None
    target: MetricTarget

    @property
    def label(self) -> str:
        """The metric name as the HPA's status messages write it (computeStatusForExternalMetric)."""
        return f"external metric {self.name}({selector_go_repr(self.selector)})"

    @property
    def display(self) -> str:
        query = selector_query(self.selector)
        return f"External {self.name}" + (f"{{{query}}}" if query else "")


@dataclass(frozen=True)
class ObjectMetric:
    name: str
    described_object: ObjectReference
    selector: LabelSelector | None
    target: MetricTarget

    @property
    def label(self) -> str:
        if self.target.type is TargetType.AVERAGE_VALUE:
            # Upstream names AverageValue Object metrics "external metric" in status messages; kept so they match.
            return f"external metric {self.name}({selector_go_repr(self.selector)})"
        return f"{self.described_object.kind} metric {self.name}"

    @property
    def display(self) -> str:
        ref = self.described_object
        return f"Object {ref.kind}/{ref.name} {self.name}"


@dataclass(frozen=True)
class UnsupportedMetric:
    """Resource, Pods and ContainerResource metrics: they need pod metrics, which Zeroscale does not compute."""

    type: str
    name: str

    @property
    def label(self) -> str:
        return f"{self.type} metric {self.name}"

    @property
    def display(self) -> str:
        return f"{self.type} {self.name}"


Metric = ExternalMetric | ObjectMetric | UnsupportedMetric


@dataclass(frozen=True)
class ScalingPolicy:
    type: PolicyType
    value: int
    period_seconds: int

    def __str__(self) -> str:
        unit = "%" if self.type is PolicyType.PERCENT else " pods"
        return f"{self.type} {self.value}{unit} per {self.period_seconds}s"


@dataclass(frozen=True)
class ScalingRules:
    """One direction of `spec.behavior`, with the API server's defaults filled in."""

    # None only for scaleDown: the controller's --horizontal-pod-autoscaler-downscale-stabilization.
    stabilization_window_seconds: int | None
    select_policy: SelectPolicy
    policies: tuple[ScalingPolicy, ...]
    tolerance: float | None = None  # KEP-4951; None: the controller's --horizontal-pod-autoscaler-tolerance

    @property
    def longest_period(self) -> int:
        return max((policy.period_seconds for policy in self.policies), default=0)


# GenerateHPAScaleUpRules / GenerateHPAScaleDownRules defaults (docs/protocols.md#hpa-behavior).
DEFAULT_SCALE_UP = ScalingRules(
    0, SelectPolicy.MAX, (ScalingPolicy(PolicyType.PODS, 4, 15), ScalingPolicy(PolicyType.PERCENT, 100, 15))
)
DEFAULT_SCALE_DOWN = ScalingRules(None, SelectPolicy.MAX, (ScalingPolicy(PolicyType.PERCENT, 100, 15),))


@dataclass(frozen=True)
class Behavior:
    scale_up: ScalingRules = DEFAULT_SCALE_UP
    scale_down: ScalingRules = DEFAULT_SCALE_DOWN


@dataclass(frozen=True)
class HPASpec:
    name: str
    namespace: str
    scale_target: ObjectReference
    min_replicas: int
    max_replicas: int
    metrics: tuple[Metric, ...]
    behavior: Behavior | None  # None: the legacy path (docs/protocols.md#hpa-behavior, `behavior: nil`)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"
