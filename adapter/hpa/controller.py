"""One HPA's reconcile loop as Kubernetes v1.37 runs it (horizontal.go, docs/protocols.md#hpa-algorithm), without I/O.

The caller reads the scale subresource, pods and metrics, calls `sync()` with what it read
and the current time, and applies `Decision.desired_replicas` when `Decision.rescale` is
true: the controller records the scale event as if that update succeeded. State kept
between syncs: recommendation history, scale events and the status conditions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from adapter.hpa.conditions import ABLE_TO_SCALE, SCALED_TO_ZERO, SCALING_ACTIVE, SCALING_LIMITED, Conditions
from adapter.hpa.decision import Decision, Event, MetricResult
from adapter.hpa.ratelimit import Limited, ScaleEvents, limit_legacy, limit_with_behavior
from adapter.hpa.replicas import Pods, ReplicaCountError, Tolerances, propose
from adapter.hpa.spec import (
    ExternalMetric,
    HPASpec,
    Metric,
    ObjectMetric,
    TargetType,
    UnsupportedMetric,
    selector_go_repr,
)
from adapter.hpa.stabilization import RecommendationHistory, Stabilized

DEFAULT_TOLERANCE = 0.1  # --horizontal-pod-autoscaler-tolerance
DEFAULT_DOWNSCALE_STABILIZATION = 300  # --horizontal-pod-autoscaler-downscale-stabilization, seconds

_DISABLED_MESSAGE = "scaling is disabled since the replica count of the target is zero"


@dataclass(frozen=True)
class MetricFailure:
    """A metric that could not be read; `message` is the client's error (e.g. a metav1.Status message)."""

    message: str


# Usage in milli-units (the sum of the items' MilliValue), or why there is none.
MetricReading = int | MetricFailure


@dataclass(frozen=True)
class _Failed:
    reason: str  # ScalingActive=False reason
    error: str  # the error the condition message quotes
    wrapped: str  # the error computeReplicasForMetric returns


@dataclass(frozen=True)
class _Computed:
    results: tuple[MetricResult, ...]
    replicas: int  # the largest proposal; -1 with `failure`
    metric: Metric | None  # whose proposal it is
    failure: str | None  # why no count could be computed (the FailedComputeMetricsReplicas event)


class HorizontalController:
    """Holds one HPA's history; `sync()` is one reconcile of it."""

    def __init__(
        self,
        spec: HPASpec,
        *,
        tolerance: float = DEFAULT_TOLERANCE,
        downscale_stabilization: int = DEFAULT_DOWNSCALE_STABILIZATION,
        scaled_to_zero: bool | None = None,
        scaled_to_zero_condition: bool = True,
    ) -> None:
        """`scaled_to_zero`: the HPA's ScaledToZero condition as found (None: absent).

        `scaled_to_zero_condition=False` models controllers older than the condition
        (docs/protocols.md#hpa-scale-to-zero "legacy"): they compute from zero whenever minReplicas is 0.
        """
        self.spec = spec
        self.tolerance = tolerance
        self.downscale_stabilization = downscale_stabilization
        self.scaled_to_zero_condition = scaled_to_zero_condition
        self.conditions = Conditions()
        self.recommendations = RecommendationHistory()
        self.events = ScaleEvents()
        if scaled_to_zero is not None:
            reason = "ScaledToZero" if scaled_to_zero else "NotScaledToZero"
            self.conditions.set(SCALED_TO_ZERO, scaled_to_zero, reason, "as found in the HPA status", 0.0)

    def tolerances(self) -> Tolerances:
        """tolerancesForHpa: per-direction values from spec.behavior, else the controller's."""
        behavior = self.spec.behavior
        if behavior is None:
            return Tolerances(self.tolerance, self.tolerance)
        down, up = behavior.scale_down.tolerance, behavior.scale_up.tolerance
        return Tolerances(self.tolerance if down is None else down, self.tolerance if up is None else up)

    def _wakes_on_metrics(self) -> bool:
        """hasObjectOrExternalMetrics: only these can read a demand while no pod runs."""
        return any(isinstance(metric, ExternalMetric | ObjectMetric) for metric in self.spec.metrics)

    def _may_compute_from_zero(self) -> bool:
        """shouldComputeMetricsForZeroReplicas: at 0, metrics are read only if the HPA itself scaled the target
        there (ScaledToZero=True) and either has a metric to wake on or had minReplicas raised since."""
        if not self.scaled_to_zero_condition:
            return self.spec.min_replicas == 0
        if not self.conditions.is_true(SCALED_TO_ZERO):
            return False
        return self.spec.min_replicas != 0 or self._wakes_on_metrics()

    def sync(
        self,
        now: float,
        current_replicas: int,
        status_replicas: int,
        ready_pods: int,
        metric_values: Sequence[MetricReading],
        *,
        listed_pods: int | None = None,
    ) -> Decision:
        """One reconcile. `metric_values` lines up with spec.metrics; `listed_pods` defaults to
        max(status_replicas, ready_pods) (it only matters for Value targets: none listed is an error)."""
        spec = self.spec
        if len(metric_values) != len(spec.metrics):
            raise ValueError(f"{spec.key}: {len(spec.metrics)} metric(s) in the spec, {len(metric_values)} reading(s)")
        pods = Pods(max(status_replicas, ready_pods) if listed_pods is None else listed_pods, ready_pods)
        self.conditions.set(
            ABLE_TO_SCALE,
            True,
            "SucceededGetScale",
            "the HPA controller was able to get the target's current scale",
            now,
        )
        current = current_replicas
        self.recommendations.record_initial(current, now)
        events: list[Event] = []
        results: tuple[MetricResult, ...] = ()
        proposal: int | None = None
        stabilized: Stabilized | None = None
        limited: Limited | None = None
        if current == 0 and not self._may_compute_from_zero():
            self.conditions.set(SCALING_ACTIVE, False, "ScalingDisabled", _DISABLED_MESSAGE, now)
            return self._decide(now, current, 0, False, results, None, None, None, events, self._disabled_why())
        if current > spec.max_replicas:
            desired, reason = spec.max_replicas, "Current number of replicas above Spec.MaxReplicas"
            shown = reason
        elif 0 < current < spec.min_replicas:  # at 0 (woken from ScaledToZero) the metrics decide, see below
            desired, reason = spec.min_replicas, "Current number of replicas below Spec.MinReplicas"
            shown = reason
        else:
            computed = self._compute(now, current, status_replicas, pods, metric_values, events)
            results, proposal = computed.results, computed.replicas
            if computed.failure is not None:
                events.append(Event("Warning", "FailedComputeMetricsReplicas", computed.failure))
                why = f"no change: the HPA cannot compute a replica count ({computed.failure})"
                return self._decide(now, current, current, False, results, None, None, None, events, why)
            desired = max(computed.replicas, 0)  # desiredReplicas starts at 0; only a larger proposal replaces it
            reason, shown = "All metrics below target", "all metrics below target"
            if computed.metric is not None and desired > current:
                reason = f"{computed.metric.label} above target"
                shown = f"{computed.metric.display} above target"
            stabilized, limited = self._normalize(now, current, desired)
            desired = limited.result
            if current == 0 and desired < spec.min_replicas:  # woken with minReplicas raised since
                desired = spec.min_replicas
        rescale = desired != current
        why = self._why(current, desired, shown, proposal, stabilized, limited)
        if rescale:
            self.conditions.set(
                ABLE_TO_SCALE,
                True,
                "SucceededRescale",
                f"the HPA controller was able to update the target scale to {desired}",
                now,
            )
            events.append(Event("Normal", "SuccessfulRescale", f"New size: {desired}; reason: {reason}"))
            self.events.store(spec.behavior, now, current, desired)
        return self._decide(now, current, desired, rescale, results, proposal, stabilized, limited, events, why)

    def _decide(
        self,
        now: float,
        current: int,
        desired: int,
        rescale: bool,
        results: tuple[MetricResult, ...],
        proposal: int | None,
        stabilized: Stabilized | None,
        limited: Limited | None,
        events: list[Event],
        why: str,
    ) -> Decision:
        self._track_zero(now, current, desired, rescale)
        return Decision(
            self.spec.key,
            current,
            desired,
            rescale,
            results,
            proposal,
            stabilized,
            limited,
            self.conditions.snapshot(),
            tuple(events),
            why,
        )

    def _track_zero(self, now: float, current: int, desired: int, rescale: bool) -> None:
        """ScaledToZero (docs/protocols.md#hpa-scale-to-zero), set on every rescale and only then, as v1.37 does:
        True when the HPA took the target from some replicas to 0 (minReplicas 0, a metric to wake on), False on any
        other rescale."""
        if not rescale or not self.scaled_to_zero_condition:
            return
        if current > 0 and desired == 0 and self.spec.min_replicas == 0 and self._wakes_on_metrics():
            self.conditions.set(
                SCALED_TO_ZERO, True, "ScaledToZero", "the HPA controller scaled the workload to zero", now
            )
        else:
            message = "the HPA controller did not scale the workload to zero"
            self.conditions.set(SCALED_TO_ZERO, False, "NotScaledToZero", message, now)

    def _disabled_why(self) -> str:
        if self.spec.min_replicas != 0:
            return f"{_DISABLED_MESSAGE} (minReplicas is {self.spec.min_replicas}: someone paused it)"
        return (
            "the target is at 0 replicas but the HPA did not scale it there (ScaledToZero is not True), "
            "so the HPA leaves it at zero"
        )

    def _compute(
        self,
        now: float,
        current: int,
        status_replicas: int,
        pods: Pods,
        readings: Sequence[MetricReading],
        events: list[Event],
    ) -> _Computed:
        """computeReplicasForMetrics: the largest proposal, unless metrics failed (see the final check)."""
        tolerances = self.tolerances()
        results: list[MetricResult] = []
        replicas, chosen = 0, None
        first: _Failed | None = None
        invalid = 0
        for metric, reading in zip(self.spec.metrics, readings, strict=True):
            result, failed = self._one(metric, reading, current, status_replicas, pods, tolerances)
            results.append(result)
            if failed is not None:
                events.append(Event("Warning", failed.reason, failed.error))
                first = first or failed
                invalid += 1
                continue
            assert result.proposal is not None
            if replicas == 0 or result.proposal > replicas:
                replicas, chosen = result.proposal, metric
        total = len(self.spec.metrics)
        if first is not None and (invalid >= total or replicas < current):
            # All failed, or some failed and the rest would scale down: hold (never act on half the facts).
            message = f"the HPA was unable to compute the replica count: {first.error}"
            self.conditions.set(SCALING_ACTIVE, False, first.reason, message, now)
            error = f"invalid metrics ({invalid} invalid out of {total}), first error is: {first.wrapped}"
            return _Computed(tuple(results), -1, None, error)
        label = "" if chosen is None else chosen.label
        message = f"the HPA was able to successfully calculate a replica count from {label}"
        self.conditions.set(SCALING_ACTIVE, True, "ValidMetricFound", message, now)
        return _Computed(tuple(results), replicas, chosen, None)

    def _one(
        self,
        metric: Metric,
        reading: MetricReading,
        current: int,
        status_replicas: int,
        pods: Pods,
        tolerances: Tolerances,
    ) -> tuple[MetricResult, _Failed | None]:
        if isinstance(metric, UnsupportedMetric):
            error = f"{metric.type} metrics need pod metrics, which Zeroscale does not compute"
            unsupported = MetricResult(metric.display, metric.name, metric.type, error=error)
            return unsupported, _Failed(f"FailedGet{metric.type}Metric", error, error)
        target = metric.target
        known = MetricResult(metric.display, metric.name, _kind(metric), target.type, target.text)
        if isinstance(reading, MetricFailure):
            failed = _fetch_failure(self.spec.namespace, metric, reading.message)
            return replace(known, error=failed.error), failed
        try:
            step = propose(target, reading, current, status_replicas, pods, tolerances)
        except ReplicaCountError as err:
            failed = _calculation_failure(metric, str(err))
            return replace(known, usage_milli=reading, error=failed.error), failed
        band = None if step.within_tolerance is None else tolerances.band
        computed = replace(
            known,
            usage_milli=step.usage_milli,
            current=step.current,
            ratio=step.ratio,
            tolerance_band=band,
            within_tolerance=step.within_tolerance,
            proposal=step.replicas,
            how=step.how,
        )
        return computed, None

    def _normalize(self, now: float, current: int, desired: int) -> tuple[Stabilized, Limited]:
        """normalizeDesiredReplicas[WithBehaviors]: stabilize, then rate-limit and clamp."""
        spec = self.spec
        behavior = spec.behavior
        if behavior is None:
            stabilized = self.recommendations.stabilize_legacy(now, desired, self.downscale_stabilization)
            limited = limit_legacy(current, stabilized.result, spec.min_replicas, spec.max_replicas)
        else:
            down_window = behavior.scale_down.stabilization_window_seconds
            if down_window is None:
                down_window = self.downscale_stabilization
            up_window = behavior.scale_up.stabilization_window_seconds or 0
            stabilized = self.recommendations.stabilize(now, current, desired, up_window, down_window)
            limited = limit_with_behavior(
                self.events, now, current, stabilized.result, behavior, spec.min_replicas, spec.max_replicas
            )
        self.conditions.set(ABLE_TO_SCALE, True, stabilized.reason, stabilized.message, now)
        self.conditions.set(SCALING_LIMITED, limited.limited, limited.reason, limited.message, now)
        return stabilized, limited

    def _why(
        self,
        current: int,
        desired: int,
        reason: str,
        proposal: int | None,
        stabilized: Stabilized | None,
        limited: Limited | None,
    ) -> str:
        if stabilized is None or limited is None:
            return f"{reason}: {current} -> {desired}"
        notes = []
        if stabilized.changed:
            notes.append(
                f"stabilization turned {stabilized.recommendation} into {stabilized.result} ({stabilized.reason})"
            )
        if limited.limited:
            notes.append(f"limits turned {limited.desired} into {limited.result} ({limited.reason})")
        detail = f"; {'; '.join(notes)}" if notes else ""
        if desired == current:
            if proposal == current:
                return f"no change: the metrics ask for the current {current} replica(s)"
            return f"no change at {current}: the metrics ask for {proposal}{detail}"
        verb = "scale up" if desired > current else "scale down"
        return f"{verb} {current} -> {desired}: {reason}{detail}"


def _kind(metric: ExternalMetric | ObjectMetric) -> str:
    return "External" if isinstance(metric, ExternalMetric) else "Object"


def _fetch_failure(namespace: str, metric: ExternalMetric | ObjectMetric, message: str) -> _Failed:
    """replica_calculator.go's error for a metric that could not be read."""
    if isinstance(metric, ExternalMetric):
        error = (
            f"unable to get external metric {namespace}/{metric.name}/{selector_go_repr(metric.selector)}: {message}"
        )
    else:
        ref = metric.described_object
        # Upstream's format string puts the arguments in this odd order; kept so messages match.
        error = f"unable to get metric {metric.name}: {ref.kind} on {namespace} {ref.name}/{message}"
    return _calculation_failure(metric, error)


def _calculation_failure(metric: ExternalMetric | ObjectMetric, error: str) -> _Failed:
    """The condition quotes `error`; computeStatusFor*Metric and computeReplicasForMetric wrap it twice."""
    average = metric.target.type is TargetType.AVERAGE_VALUE
    if isinstance(metric, ExternalMetric):
        middle = (
            f"failed to get {metric.name} external metric: {error}"
            if average
            else f"failed to get external metric {metric.name}: {error}"
        )
        return _Failed("FailedGetExternalMetric", error, f"failed to get {metric.name} external metric value: {middle}")
    middle = f"failed to get {metric.name} object metric: {error}" if average else error
    return _Failed("FailedGetObjectMetric", error, f"failed to get object metric value: {middle}")
