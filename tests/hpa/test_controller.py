"""The reconcile around the math: scale to and from zero, conditions, failed metrics
(docs/protocols.md#hpa-replica-math, docs/protocols.md#hpa-behavior, docs/protocols.md#hpa-scale-to-zero,
docs/protocols.md#em-response)."""

from __future__ import annotations

from adapter.hpa import Decision, HorizontalController, MetricFailure
from adapter.k8s_wire.quantity import quantity_milli
from tests.hpa.builders import condition, follow, make_controller, make_spec, sync

FAST_DOWN = {"scaleDown": {"stabilizationWindowSeconds": 30}}


def has_scaled_to_zero(decision: Decision) -> bool:
    return any(found.type == "ScaledToZero" for found in decision.conditions)


def test_scaled_to_zero_lifecycle() -> None:
    """docs/protocols.md#hpa-scale-to-zero as v1.37 runs it (checked in tests/e2e/test_08_hpa_table.py): set on rescales
    only; True once the HPA itself scales to 0; False/NotScaledToZero after waking."""
    controller = make_controller(min_replicas=0, behavior=FAST_DOWN)
    decision, replicas = follow(controller, 0, 2, "20")
    assert not has_scaled_to_zero(decision), "no rescale: the condition is not written"
    decision, replicas = follow(controller, 15, replicas, "0")
    assert replicas == 2  # the 30 s down window still holds the t=0 recommendation
    decision, replicas = follow(controller, 31, replicas, "0")
    assert (replicas, decision.rescale) == (0, True)
    assert condition(decision, "ScaledToZero") == (True, "ScaledToZero")
    decision, replicas = follow(controller, 46, replicas, "0")
    assert replicas == 0
    assert condition(decision, "ScaledToZero") == (True, "ScaledToZero")
    assert condition(decision, "ScalingActive") == (True, "ValidMetricFound")  # metrics are read at zero
    decision, replicas = follow(controller, 61, replicas, "35")
    assert (replicas, decision.rescale) == (4, True)  # ceil(35/10) = 4, within the default Pods 4 from 0
    assert condition(decision, "ScaledToZero") == (False, "NotScaledToZero")


def test_every_other_rescale_says_not_scaled_to_zero_and_a_failed_read_says_nothing() -> None:
    """v1.37 writes ScaledToZero=False on a rescale that does not end at 0 from above, whatever minReplicas;
    a sync that cannot read its metric writes no ScaledToZero at all."""
    immediate = {"scaleDown": {"stabilizationWindowSeconds": 0}}
    decision = sync(make_controller(min_replicas=1, behavior=immediate), 0, 3, "0")
    assert (decision.desired_replicas, decision.rescale) == (1, True)
    assert condition(decision, "ScaledToZero") == (False, "NotScaledToZero")
    failed = make_controller(min_replicas=0).sync(0, 2, 2, 2, [MetricFailure("the server is currently unable")])
    assert not has_scaled_to_zero(failed)


def test_woken_with_min_replicas_raised_since_the_metrics_decide() -> None:
    """shouldComputeMetricsForZeroReplicas: ScaledToZero=True and minReplicas raised to 2 since: at 0 the metrics
    are read (not the "below minReplicas" shortcut), and the count is at least minReplicas."""
    decision = sync(make_controller(min_replicas=2, scaled_to_zero=True), 0, 0, "50")
    assert (decision.desired_replicas, decision.rescale) == (4, True)  # ceil(50/10) = 5, the default Pods 4 from 0
    assert condition(decision, "ScalingActive") == (True, "ValidMetricFound")
    idle = sync(make_controller(min_replicas=2, scaled_to_zero=True), 0, 0, "0")
    assert (idle.desired_replicas, condition(idle, "ScalingActive")) == (2, (True, "ValidMetricFound"))


def test_no_wake_for_a_workload_someone_else_set_to_zero() -> None:
    """docs/protocols.md#hpa-scale-to-zero: without ScaledToZero=True, 0 replicas means "paused": ScalingDisabled, no
    change."""
    controller = make_controller(min_replicas=0, behavior=FAST_DOWN)
    follow(controller, 0, 3, "30")  # running: ScaledToZero=False
    decision = sync(controller, 15, 0, "500")  # a person (or proxy) set replicas 1 -> 0
    assert (decision.desired_replicas, decision.rescale) == (0, False)
    assert condition(decision, "ScalingActive") == (False, "ScalingDisabled")
    assert decision.metrics == ()  # not even read


def test_fresh_hpa_at_zero_never_scales() -> None:
    """docs/protocols.md#hpa-scale-to-zero KEP caveat: a fresh replicas: 0 Deployment with a minReplicas: 0 HPA never
    scales."""
    controller = make_controller(min_replicas=0)
    for tick in range(3):
        decision = sync(controller, tick * 15, 0, "500")
        assert decision.desired_replicas == 0
        assert condition(decision, "ScalingActive") == (False, "ScalingDisabled")


def test_min_replicas_above_zero_and_target_at_zero_is_paused() -> None:
    """docs/protocols.md#hpa-scale-to-zero legacy convention: spec.replicas 0 with minReplicas != 0 -> ScalingDisabled
    with its message."""
    decision = sync(make_controller(min_replicas=2), 0, 0, "500")
    assert decision.desired_replicas == 0
    active = next(c for c in decision.conditions if c.type == "ScalingActive")
    assert (active.status, active.reason) == (False, "ScalingDisabled")
    assert active.message == "scaling is disabled since the replica count of the target is zero"


def test_controllers_without_the_condition_compute_from_zero() -> None:
    """docs/protocols.md#hpa-scale-to-zero legacy controller: replicas == 0 && minReplicas == 0 -> metrics are computed
    (0 -> N math)."""
    controller = HorizontalController(make_spec(min_replicas=0), scaled_to_zero_condition=False)
    decision = sync(controller, 0, 0, "25")
    assert decision.desired_replicas == 3
    assert all(c.type != "ScaledToZero" for c in decision.conditions)


def test_value_target_with_a_pod_not_ready_is_kept_only_by_the_down_window() -> None:
    """docs/protocols.md#hpa-replica-math trap: Value target, replicas 1, pod not Ready -> proposal 0; only the down
    window keeps the pod."""
    woken_with_history = make_controller(min_replicas=0, target=("Value", "10"), behavior={}, scaled_to_zero=True)
    follow(woken_with_history, 0, 1, "10")  # an earlier sync recommended 1
    decision = sync(woken_with_history, 15, 1, "50", ready=0)
    assert decision.metrics[0].proposal == 0
    assert decision.desired_replicas == 1
    assert condition(decision, "AbleToScale") == (True, "ScaleDownStabilized")

    woken_without = make_controller(min_replicas=0, target=("Value", "10"), behavior={}, scaled_to_zero=True)
    follow(woken_without, 0, 0, "0")  # at zero, recommending 0; then the proxy wakes it to 1
    decision = sync(woken_without, 15, 1, "50", ready=0)
    assert (decision.metrics[0].proposal, decision.desired_replicas) == (0, 0)


def test_average_value_wakes_regardless_of_readiness() -> None:
    """docs/protocols.md#hpa-replica-math: AverageValue never looks at readiness, which is why it suits
    scale-from-zero."""
    controller = make_controller(min_replicas=0, behavior={}, scaled_to_zero=True)
    follow(controller, 0, 0, "0")
    decision = sync(controller, 15, 1, "50", ready=0)
    assert decision.desired_replicas == 5


def test_all_metrics_failing_holds_the_current_count() -> None:
    """docs/protocols.md#em-response, docs/protocols.md#em-errors, docs/protocols.md#hpa-behavior: an error (e.g. empty
    items) -> ScalingActive=False FailedGetExternalMetric, no scaling."""
    controller = make_controller(min_replicas=1, behavior={})
    decision = controller.sync(0, 3, 3, 3, [MetricFailure("no metrics returned from external metrics API")])
    assert (decision.desired_replicas, decision.rescale, decision.proposal) == (3, False, None)
    active = next(c for c in decision.conditions if c.type == "ScalingActive")
    assert (active.status, active.reason) == (False, "FailedGetExternalMetric")
    assert active.message == (
        "the HPA was unable to compute the replica count: unable to get external metric default/queue/nil: "
        "no metrics returned from external metrics API"
    )
    assert [e.reason for e in decision.events] == ["FailedGetExternalMetric", "FailedComputeMetricsReplicas"]
    assert decision.events[1].message == (
        "invalid metrics (1 invalid out of 1), first error is: failed to get queue external metric value: "
        "failed to get queue external metric: unable to get external metric default/queue/nil: "
        "no metrics returned from external metrics API"
    )
    assert len(controller.recommendations) == 1  # only the initial one: no normalization ran


def test_value_target_errors_are_wrapped_differently() -> None:
    """horizontal.go wraps Value errors as 'failed to get external metric NAME' (AverageValue: 'NAME external')."""
    controller = make_controller(target=("Value", "10"))
    decision = controller.sync(0, 3, 3, 3, [MetricFailure("boom")])
    assert decision.events[1].message == (
        "invalid metrics (1 invalid out of 1), first error is: failed to get queue external metric value: "
        "failed to get external metric queue: unable to get external metric default/queue/nil: boom"
    )


def test_first_sync_seeds_the_history_with_the_current_count() -> None:
    """recordInitialRecommendation: right after a (re)start a scale-down waits out the down window."""
    controller = make_controller(behavior={"scaleDown": {"stabilizationWindowSeconds": 60}})
    assert sync(controller, 0, 6, "10").desired_replicas == 6
    assert sync(controller, 45, 6, "10").desired_replicas == 6
    assert sync(controller, 60, 6, "10").desired_replicas == 1


def two_metrics() -> list[dict[str, object]]:
    def external(name: str) -> dict[str, object]:
        return {
            "type": "External",
            "external": {"metric": {"name": name}, "target": {"type": "AverageValue", "averageValue": "10"}},
        }

    return [external("a"), external("b")]


def test_a_failed_metric_does_not_block_a_scale_up() -> None:
    """computeReplicasForMetrics: with some metrics invalid, scale up on the rest; ScalingActive stays True."""
    controller = make_controller(metrics=two_metrics(), behavior={})
    decision = controller.sync(0, 2, 2, 2, [MetricFailure("boom"), quantity_milli("60")])
    assert decision.desired_replicas == 6
    assert condition(decision, "ScalingActive") == (True, "ValidMetricFound")


def test_a_failed_metric_blocks_a_scale_down() -> None:
    """computeReplicasForMetrics: some invalid and the rest would scale down -> hold (never act on half the facts)."""
    controller = make_controller(metrics=two_metrics(), behavior={"scaleDown": {"stabilizationWindowSeconds": 0}})
    decision = controller.sync(0, 5, 5, 5, [MetricFailure("boom"), quantity_milli("10")])
    assert decision.desired_replicas == 5
    assert condition(decision, "ScalingActive") == (False, "FailedGetExternalMetric")


def test_the_largest_proposal_wins() -> None:
    """docs/protocols.md#hpa-replica-math: with several metrics, the largest replica proposal is used."""
    controller = make_controller(metrics=two_metrics(), behavior={})
    decision = controller.sync(0, 2, 2, 2, [quantity_milli("30"), quantity_milli("50")])
    assert (decision.proposal, decision.desired_replicas) == (5, 5)
    assert "external metric b(nil) above target" in decision.events[0].message


def test_out_of_range_counts_are_corrected_before_metrics() -> None:
    """horizontal.go: current > max -> max; current < min -> min, without reading metrics."""
    above = sync(make_controller(min_replicas=1, max_replicas=5), 0, 9, "0")
    assert (above.desired_replicas, above.metrics) == (5, ())
    assert "Current number of replicas above Spec.MaxReplicas" in above.events[0].message
    below = sync(make_controller(min_replicas=3, max_replicas=5), 0, 1, "0")
    assert below.desired_replicas == 3


def test_object_metric_failure_message() -> None:
    """Object metrics fail with upstream's (oddly ordered) message and FailedGetObjectMetric."""
    metric = {
        "type": "Object",
        "object": {
            "describedObject": {"apiVersion": "v1", "kind": "Service", "name": "front"},
            "metric": {"name": "held"},
            "target": {"type": "Value", "value": "10"},
        },
    }
    controller = make_controller(metrics=[metric])
    decision = controller.sync(0, 1, 1, 1, [MetricFailure("down")])
    active = next(c for c in decision.conditions if c.type == "ScalingActive")
    assert active.reason == "FailedGetObjectMetric"
    assert active.message.endswith("unable to get metric held: Service on default front/down")


def test_condition_transition_time_moves_only_when_status_flips() -> None:
    """setCondition: the same status keeps lastTransitionTime; a flip moves it."""
    controller = make_controller(min_replicas=1, behavior={})
    sync(controller, 0, 2, "20")
    sync(controller, 15, 2, "20")
    active = controller.conditions.get("ScalingActive")
    assert active is not None
    assert active.last_transition == 0
    controller.sync(30, 2, 2, 2, [MetricFailure("x")])
    active = controller.conditions.get("ScalingActive")
    assert active is not None
    assert active.last_transition == 30


def test_explanation_names_each_step() -> None:
    decision = sync(make_controller(behavior={}), 0, 2, "100")
    text = "\n".join(decision.explanation())
    for piece in (
        "ratio 5",
        "raw recommendation (largest proposal): 10",
        "stabilization:",
        "policy Pods 4",
        "final: 6",
    ):
        assert piece in text
