"""Every call of KEDA's external scaler is a SERVER span continuing KEDA's trace; StreamIsActive's span tells what
it sent. Reads down to the source: tests/sources/redis/test_tracing.py."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
from opentelemetry.trace import StatusCode

from adapter.telemetry import tracing
from tests.fixtures.grpc_servers import StartAdapter, ref, scaler_stub
from tests.fixtures.traces import CALLER_SPAN, CALLER_TRACE, TRACEPARENT, Traces, attributes, one, parent_id


@pytest.fixture
def traces() -> Iterator[Traces]:
    with Traces() as traces:
        yield traces


async def test_every_call_continues_kedas_trace_and_the_stream_tells_what_it_sent(
    start_adapter: StartAdapter, traces: Traces
) -> None:
    adapter = await start_adapter()
    metadata = [("traceparent", TRACEPARENT)]
    async with grpc.aio.insecure_channel(f"127.0.0.1:{adapter.grpc_port}") as channel:
        stub = scaler_stub(channel)
        await stub.GetMetricSpec(ref(), metadata=metadata)
        assert (await stub.IsActive(ref(), metadata=metadata)).result is True
        stream = stub.StreamIsActive(ref(), metadata=metadata)
        assert (await stream.read()).result is True
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await stub.IsActive(ref(metric="nope"))
        assert failed.value.code() == grpc.StatusCode.NOT_FOUND
        await adapter.stop()  # ends the stream, and its span

    spans = traces.ended()
    for method in ("GetMetricSpec", "IsActive", "StreamIsActive"):
        call = one(spans, tracing.KEDA_CALLS[method], CALLER_TRACE)
        assert parent_id(call) == CALLER_SPAN
        assert attributes(call)[tracing.RPC_METHOD] == method
        assert attributes(call)[tracing.SELECTOR] == "queue=orders"
    sent = one(spans, tracing.KEDA_CALLS["StreamIsActive"]).events
    assert [(event.name, dict(event.attributes or {})) for event in sent] == [
        (tracing.KEDA_ACTIVITY_SENT, {tracing.KEDA_ACTIVE: True})
    ]
    refused = [span for span in spans if attributes(span).get(tracing.METRIC) == "nope"]
    assert [attributes(span)[tracing.RPC_STATUS] for span in refused] == [grpc.StatusCode.NOT_FOUND.value[0]]
    assert refused[0].status.status_code is StatusCode.UNSET  # the caller's error, not the server's
