"""KEDA's external scaler against `zeroscale serve` (static values), called the way KEDA calls it
(docs/protocols.md#keda-external-scaler)."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import REGISTRY

from adapter.rpc.generated import externalscaler_pb2 as pb
from adapter.rpc.generated import externalscaler_pb2_grpc as pb_grpc
from adapter.serve import serve
from tests.fixtures.adapter_inprocess import DEMO_SOURCES
from tests.fixtures.grpc_servers import DEMO_METRICS, StartAdapter, adapter_config, ref, scaler_stub
from tests.fixtures.httpclient import fetch


async def keda_poll(stub: pb_grpc.ExternalScalerStub, scaled: pb.ScaledObjectRef) -> tuple[float, int, bool]:
    """One KEDA polling cycle (GetMetricsAndActivity): GetMetrics, then IsActive."""
    spec = (await stub.GetMetricSpec(scaled)).metricSpecs[0]
    # KEDA names the HPA metric s<idx>-<name> and sends the name back without the index, possibly lower-cased.
    request = pb.GetMetricsRequest(scaledObjectRef=scaled, metricName=spec.metricName.lower())
    value = (await stub.GetMetrics(request)).metricValues[0]
    active = (await stub.IsActive(scaled)).result
    return value.metricValueFloat, value.metricValue, active


async def test_metric_spec_comes_from_the_metadata(scaler_channel: pb_grpc.ExternalScalerStub) -> None:
    answer = await scaler_channel.GetMetricSpec(ref(targetValue="2.5"))
    assert len(answer.metricSpecs) == 1
    spec = answer.metricSpecs[0]
    assert spec.metricName == "Demo-Queue-Depth"  # the catalogue's spelling, whatever case the trigger used
    assert spec.targetSizeFloat == 2.5
    assert spec.targetSize == 3  # rounded up for old KEDA versions
    default = (await scaler_channel.GetMetricSpec(ref())).metricSpecs[0]
    assert (default.targetSizeFloat, default.targetSize) == (1.0, 1)


async def test_poll_reads_value_and_activity(scaler_channel: pb_grpc.ExternalScalerStub) -> None:
    assert await keda_poll(scaler_channel, ref(selector="queue=orders")) == (1500.0, 1500, True)
    # 0.5 is below the default activation threshold (1); the int field rounds up for old KEDA.
    assert await keda_poll(scaler_channel, ref(selector="queue=emails")) == (0.5, 1, False)
    # Both series summed, as the metrics API sums them.
    assert await keda_poll(scaler_channel, ref(selector="queue in (orders,emails)")) == (1500.5, 1501, True)


async def test_names_match_without_case(scaler_channel: pb_grpc.ExternalScalerStub) -> None:
    upper = ref(metric="DEMO-QUEUE-DEPTH")
    request = pb.GetMetricsRequest(scaledObjectRef=upper, metricName="demo-queue-depth")
    assert (await scaler_channel.GetMetrics(request)).metricValues[0].metricValueFloat == 1500.0
    request = pb.GetMetricsRequest(scaledObjectRef=ref(), metricName="Demo-Queue-Depth")
    answer = await scaler_channel.GetMetrics(request)
    assert answer.metricValues[0].metricName == "Demo-Queue-Depth"  # echoed as asked


async def test_namespace_defaults_to_the_scaled_objects(scaler_channel: pb_grpc.ExternalScalerStub) -> None:
    """`team-depth` may be read only from namespace `team`."""
    in_team = pb.ScaledObjectRef(name="w", namespace="team", scalerMetadata={"metricName": "team-depth"})
    assert (await scaler_channel.IsActive(in_team)).result is True
    elsewhere = pb.ScaledObjectRef(name="w", namespace="default", scalerMetadata={"metricName": "team-depth"})
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        await scaler_channel.IsActive(elsewhere)
    assert failed.value.code() == grpc.StatusCode.NOT_FOUND
    same = pb.ScaledObjectRef(
        name="w", namespace="team", scalerMetadata={"metricName": "team-depth", "namespace": "team"}
    )
    assert (await scaler_channel.IsActive(same)).result is True  # naming its own namespace is fine


async def test_another_namespace_only_with_the_override(start_adapter: StartAdapter) -> None:
    adapter = await start_adapter(allow_namespace_override=True)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{adapter.grpc_port}") as channel:
        overridden = pb.ScaledObjectRef(
            name="w", namespace="default", scalerMetadata={"metricName": "team-depth", "namespace": "team"}
        )
        assert (await scaler_stub(channel).IsActive(overridden)).result is True


@pytest.mark.parametrize(
    ("scaled", "code", "words"),
    [
        (ref(metric="no-such-metric"), grpc.StatusCode.NOT_FOUND, "no-such-metric"),
        (pb.ScaledObjectRef(namespace="default"), grpc.StatusCode.INVALID_ARGUMENT, "metricName is required"),
        (ref(selector="color=red"), grpc.StatusCode.INVALID_ARGUMENT, "not a selector label"),
        (ref(selector="queue=Upper"), grpc.StatusCode.INVALID_ARGUMENT, "does not match the pattern"),
        (ref(targetValue="-1"), grpc.StatusCode.INVALID_ARGUMENT, "targetValue must be a number above 0"),
        (ref(targetValue="lots"), grpc.StatusCode.INVALID_ARGUMENT, "not a number"),
    ],
)
async def test_errors_carry_a_status_and_a_reason(
    scaler_channel: pb_grpc.ExternalScalerStub, scaled: pb.ScaledObjectRef, code: grpc.StatusCode, words: str
) -> None:
    calls = [
        scaler_channel.GetMetrics(pb.GetMetricsRequest(scaledObjectRef=scaled, metricName="demo-queue-depth")),
        scaler_channel.IsActive(scaled),
    ]
    if "selector" not in words and "pattern" not in words:  # GetMetricSpec does not read a series
        calls.append(scaler_channel.GetMetricSpec(scaled))
    for call in calls:
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await call
        assert failed.value.code() == code
        assert words in (failed.value.details() or "")


async def test_get_metrics_refuses_another_metric_name(scaler_channel: pb_grpc.ExternalScalerStub) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        await scaler_channel.GetMetrics(pb.GetMetricsRequest(scaledObjectRef=ref(), metricName="other"))
    assert failed.value.code() == grpc.StatusCode.NOT_FOUND


async def test_unavailable_source_is_an_error_not_a_zero(start_adapter: StartAdapter) -> None:
    """A static source with no matching series fails; KEDA must see UNAVAILABLE, never a made-up 0."""
    adapter = await start_adapter()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{adapter.grpc_port}") as channel:
        stub = scaler_stub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await stub.GetMetrics(pb.GetMetricsRequest(scaledObjectRef=ref(selector="queue=absent")))
        assert failed.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_stream_metric_spec_sends_the_spec_at_once_and_stays_open(
    scaler_channel: pb_grpc.ExternalScalerStub,
) -> None:
    scaled = ref(targetValue="7")
    call = scaler_channel.StreamMetricSpec(scaled)
    first = await asyncio.wait_for(call.read(), 5)
    assert first == await scaler_channel.GetMetricSpec(scaled)
    with pytest.raises(TimeoutError):  # nothing changes, nothing more is sent, the stream stays open
        await asyncio.wait_for(asyncio.shield(call.read()), 0.3)
    assert not call.done()
    call.cancel()


async def test_streams_are_bounded(start_adapter: StartAdapter) -> None:
    adapter = await start_adapter(max_streams=1)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{adapter.grpc_port}") as channel:
        stub = scaler_stub(channel)
        first = stub.StreamIsActive(ref())
        assert (await asyncio.wait_for(first.read(), 5)).result is True
        second = stub.StreamMetricSpec(ref())
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await asyncio.wait_for(second.read(), 5)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "max_streams" in (refused.value.details() or "")
        first.cancel()
        await asyncio.sleep(0.1)
        third = stub.StreamMetricSpec(ref())
        assert len((await asyncio.wait_for(third.read(), 5)).metricSpecs) == 1
        third.cancel()


async def test_health_service_reports_serving(start_adapter: StartAdapter) -> None:
    adapter = await start_adapter()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{adapter.grpc_port}") as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "externalscaler.ExternalScaler"):
            answer = await health.Check(health_pb2.HealthCheckRequest(service=service))
            assert answer.status == health_pb2.HealthCheckResponse.SERVING


async def test_messages_above_the_bound_are_refused(start_adapter: StartAdapter) -> None:
    adapter = await start_adapter(max_message_bytes=4096)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{adapter.grpc_port}") as channel:
        stub = scaler_stub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.IsActive(ref(padding="x" * 10_000))
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "is over grpc.scaler.max_message_bytes (4096)" in (refused.value.details() or "")
        with pytest.raises(grpc.aio.AioRpcError) as far_over:  # gRPC's own backstop, at 4 times the bound
            await stub.IsActive(ref(padding="x" * 20_000))
        assert far_over.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert (await stub.IsActive(ref())).result is True


async def test_a_taken_port_stops_the_start(start_adapter: StartAdapter) -> None:
    """SO_REUSEPORT is off: a second server on the same port fails instead of sharing KEDA's calls."""
    first = await start_adapter()
    config = adapter_config(DEMO_SOURCES, DEMO_METRICS, first.grpc_port)
    assert await asyncio.wait_for(serve(config, asyncio.Event()), 10) == 1


async def test_calls_are_counted(scaler_channel: pb_grpc.ExternalScalerStub) -> None:
    def count(code: str) -> float:
        labels = {"server": "scaler", "method": "IsActive", "code": code}
        return REGISTRY.get_sample_value("zeroscale_grpc_requests_total", labels) or 0.0

    ok, not_found = count("OK"), count("NOT_FOUND")
    await scaler_channel.IsActive(ref())
    with pytest.raises(grpc.aio.AioRpcError):
        await scaler_channel.IsActive(ref(metric="absent"))
    assert (count("OK"), count("NOT_FOUND")) == (ok + 1, not_found + 1)


async def test_a_pattern_bound_to_the_namespace_refuses_another_teams_values(start_adapter: StartAdapter) -> None:
    """`{namespace}` in a label's pattern is the asking namespace: the ScaledObject's for KEDA, the path's for an
    HPA, one check for both. Team A reads its own group, never team B's (INVALID_ARGUMENT, and a 400 on the API,
    naming the pattern and what it was in A)."""
    groups = [{"labels": {"group": "team-a_orders"}, "value": 4}, {"labels": {"group": "team-b_orders"}, "value": 9}]
    source = {"name": "lag", "type": "static", "series": groups}
    label = {"group": {"pattern": "{namespace}_.+", "required": True}}
    adapter = await start_adapter([source], [{"name": "team-lag", "type": "static", "source": "lag", "labels": label}])
    refusal = r"value 'team-b_orders' of label 'group' does not match the pattern '{namespace}_.+' that metric "
    refusal += r"team-lag allows in namespace team-a (there: 'team\\-a_.+')"
    async with grpc.aio.insecure_channel(f"127.0.0.1:{adapter.grpc_port}") as channel:
        stub = scaler_stub(channel)

        async def keda_reads(owner: str, group: str) -> float:
            scaled = ref(metric="team-lag", selector=f"group={group}", owner=owner)
            request = pb.GetMetricsRequest(scaledObjectRef=scaled, metricName="team-lag")
            value: float = (await stub.GetMetrics(request)).metricValues[0].metricValueFloat
            return value

        assert await keda_reads("team-a", "team-a_orders") == 4
        assert await keda_reads("team-b", "team-b_orders") == 9
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await keda_reads("team-a", "team-b_orders")
        assert failed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert failed.value.details() == refusal
    api = "/apis/external.metrics.k8s.io/v1beta1/namespaces/{}/team-lag?labelSelector=group%3D{}"
    answer = await fetch(adapter.port, api.format("team-a", "team-a_orders"))
    assert (answer.status, answer.json()["items"][0]["value"]) == (200, "4")
    answer = await fetch(adapter.port, api.format("team-a", "team-b_orders"))
    assert (answer.status, answer.json()["message"]) == (400, refusal)
