"""KEDA's external scaler (`externalscaler.ExternalScaler`), answered from the same cache as the metrics API.

A trigger's `scalerMetadata` names a catalogue metric and its series:

| key             | meaning                                                        | default                     |
|-----------------|----------------------------------------------------------------|-----------------------------|
| `metricName`    | a metric of the catalogue (any case)                           | required                    |
| `namespace`     | the ScaledObject's own (another only with                      | the ScaledObject's          |
|                 | grpc.scaler.allow_namespace_override)                          |                             |
| `labelSelector` | the selector the HPA would send, e.g. `route=web`              | empty                       |
| `targetValue`   | the target per replica, returned by GetMetricSpec              | 1                           |

Other keys (KEDA passes `scalerAddress` too) are ignored. Active means value >= the metric's
`activation_threshold`. StreamIsActive is driven by the cache's refresh hook, never by polling.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import AsyncIterator
from dataclasses import dataclass
from decimal import Decimal
from typing import NoReturn

import grpc
from opentelemetry.trace import Span

from adapter.config.grpc import ScalerServerConfig
from adapter.metrics.cache import MetricCache, Reading
from adapter.metrics.catalogue import namespace_problem
from adapter.metrics.errors import BadSelector, MetricError, MetricNotFound, MetricUnavailable
from adapter.rpc.generated import externalscaler_pb2 as pb
from adapter.rpc.generated import externalscaler_pb2_grpc as pb_grpc
from adapter.rpc.server import Context, RunningServer, StreamSlots, start_server
from adapter.rpc.tracing import TracingInterceptor, call_span
from adapter.telemetry import reads as spans
from adapter.telemetry import rpc as telemetry
from adapter.telemetry import tracing

log = logging.getLogger(__name__)

SERVICE = "externalscaler.ExternalScaler"
_SERVER = "scaler"
_INT64_MAX = 2**63 - 1
_STATUS = {
    MetricNotFound: grpc.StatusCode.NOT_FOUND,
    BadSelector: grpc.StatusCode.INVALID_ARGUMENT,
    MetricUnavailable: grpc.StatusCode.UNAVAILABLE,
}


@dataclass(frozen=True)
class Trigger:
    """What one ScaledObjectRef asks for, from its scalerMetadata."""

    metric: str
    namespace: str
    selector: str
    target: float


def _namespace(ref: pb.ScaledObjectRef, allow_override: bool) -> str:
    """The namespace read: the ScaledObject's. KEDA reads for whoever may create a ScaledObject, so a
    trigger naming another namespace would make KEDA a deputy reading (and filling the series table of)
    namespaces its author cannot see; that is refused unless the operator allows it."""
    own = ref.namespace
    asked = ref.scalerMetadata.get("namespace", "").strip()
    for name in filter(None, (own, asked)):
        problem = namespace_problem(name)
        if problem is not None:
            raise BadSelector(problem)
    if not own:
        raise BadSelector("the ScaledObjectRef names no namespace (KEDA always sends the ScaledObject's)")
    if asked and asked != own and not allow_override:
        raise BadSelector(
            f"scalerMetadata.namespace {asked!r} is not the ScaledObject's namespace {own!r}: a trigger reads "
            "its own namespace (remove the key, or set grpc.scaler.allow_namespace_override: true)"
        )
    return asked or own


def parse_trigger(ref: pb.ScaledObjectRef, config: ScalerServerConfig) -> Trigger:
    """Read the documented metadata keys; raise BadSelector (INVALID_ARGUMENT) on a missing or bad one.

    The size comes first: a selector is parsed only when the metadata fits in `max_metadata_bytes`.
    """
    max_metadata_bytes = config.max_metadata_bytes
    meta = ref.scalerMetadata
    size = sum(len(text.encode()) for text in (ref.name, ref.namespace, *meta.keys(), *meta.values()))
    if size > max_metadata_bytes:
        raise BadSelector(
            f"scalerMetadata holds {size} bytes, more than grpc.scaler.max_metadata_bytes ({max_metadata_bytes})"
        )
    metric = meta.get("metricName", "").strip()
    if not metric:
        raise BadSelector("scalerMetadata.metricName is required: the name of a Zeroscale metric")
    namespace = _namespace(ref, config.allow_namespace_override)
    text = meta.get("targetValue", "1").strip()
    try:
        target = float(text)
    except ValueError:
        raise BadSelector(f"scalerMetadata.targetValue {text!r} is not a number") from None
    if not math.isfinite(target) or target <= 0:
        raise BadSelector(f"scalerMetadata.targetValue must be a number above 0, got {text!r}")
    return Trigger(metric, namespace, meta.get("labelSelector", "").strip(), target)


def _described(trigger: Trigger) -> Span | None:
    """The call's span (tracing on), told which series the trigger reads."""
    span = call_span()
    if span is not None:
        spans.describe_series(span, trigger.metric, trigger.namespace, trigger.selector)
    return span


def _round_up(value: Decimal | float) -> int:
    """The int64 field old KEDA versions read: the value rounded up, clamped to int64."""
    return max(-_INT64_MAX - 1, min(_INT64_MAX, math.ceil(value)))


class ExternalScaler(pb_grpc.ExternalScalerServicer):
    def __init__(self, cache: MetricCache, config: ScalerServerConfig) -> None:
        self._cache = cache
        self._heartbeat = config.heartbeat_interval
        self._config = config
        self.slots = StreamSlots(_SERVER, config)

    # --- helpers ---

    async def _fail(self, context: Context, method: str, err: MetricError) -> NoReturn:
        code = _STATUS.get(type(err), grpc.StatusCode.INTERNAL)
        telemetry.GRPC_REQUESTS.labels(_SERVER, method, code.name).inc()
        await context.abort(code, err.message)

    def _spec(self, trigger: Trigger) -> pb.GetMetricSpecResponse:
        name = self._cache.catalogue.metric(trigger.metric).name  # raises MetricNotFound
        spec = pb.MetricSpec(metricName=name, targetSize=_round_up(trigger.target), targetSizeFloat=trigger.target)
        return pb.GetMetricSpecResponse(metricSpecs=[spec])

    async def _read(self, trigger: Trigger) -> Reading:
        span = None if tracing.TRACER is None else _described(trigger)
        return await self._cache.read(trigger.metric, trigger.namespace, trigger.selector, span)

    def _active(self, trigger: Trigger, reading: Reading) -> bool:
        threshold = self._cache.catalogue.metric(trigger.metric).activation_threshold
        return reading.value >= Decimal(repr(threshold))

    # --- unary calls (KEDA's poll: GetMetricSpec once, then GetMetrics and IsActive) ---

    async def GetMetricSpec(
        self,
        request: pb.ScaledObjectRef,
        context: Context,
    ) -> pb.GetMetricSpecResponse:
        try:
            trigger = parse_trigger(request, self._config)
            if tracing.TRACER is not None:
                _described(trigger)
            answer = self._spec(trigger)
        except MetricError as err:
            await self._fail(context, "GetMetricSpec", err)
        telemetry.GRPC_REQUESTS.labels(_SERVER, "GetMetricSpec", "OK").inc()
        return answer

    async def GetMetrics(
        self,
        request: pb.GetMetricsRequest,
        context: Context,
    ) -> pb.GetMetricsResponse:
        try:
            trigger = parse_trigger(request.scaledObjectRef, self._config)
            asked = request.metricName
            # KEDA may send the name lower-cased (kedacore/keda#4954): compare without case.
            if asked and asked.lower() != trigger.metric.lower():
                raise MetricNotFound(f"this trigger serves metric {trigger.metric}, not {asked}")
            reading = await self._read(trigger)
        except MetricError as err:
            await self._fail(context, "GetMetrics", err)
        telemetry.GRPC_REQUESTS.labels(_SERVER, "GetMetrics", "OK").inc()
        value = pb.MetricValue(
            metricName=asked or trigger.metric,
            metricValue=_round_up(reading.value),
            metricValueFloat=float(reading.value),
        )
        return pb.GetMetricsResponse(metricValues=[value])

    async def IsActive(
        self,
        request: pb.ScaledObjectRef,
        context: Context,
    ) -> pb.IsActiveResponse:
        try:
            trigger = parse_trigger(request, self._config)
            active = self._active(trigger, await self._read(trigger))
        except MetricError as err:
            await self._fail(context, "IsActive", err)
        telemetry.GRPC_REQUESTS.labels(_SERVER, "IsActive", "OK").inc()
        return pb.IsActiveResponse(result=active)

    # --- streams ---

    async def StreamIsActive(
        self,
        request: pb.ScaledObjectRef,
        context: Context,
    ) -> AsyncIterator[pb.IsActiveResponse]:
        """The activity now, then a message whenever it flips, plus the current state every heartbeat."""
        try:
            trigger = parse_trigger(request, self._config)
            key, _ = self._cache.catalogue.resolve(trigger.metric, trigger.namespace, trigger.selector)
        except MetricError as err:
            await self._fail(context, "StreamIsActive", err)
            return
        async with self.slots.hold(context, "StreamIsActive") as updated:
            unsubscribe = self._cache.subscribe(key, lambda _reading: updated.set())
            loop = asyncio.get_running_loop()
            sent: bool | None = None
            heartbeat_at = loop.time()
            try:
                while not self.slots.closing:
                    updated.clear()
                    active = await self._current_activity(trigger)
                    now = loop.time()
                    if active is not None and (active != sent or now >= heartbeat_at):
                        kind = "change" if active != sent else "heartbeat"
                        if kind == "change" and (span := call_span()) is not None:
                            span.add_event(tracing.KEDA_ACTIVITY_SENT, {tracing.KEDA_ACTIVE: active})
                        telemetry.STREAM_MESSAGES.labels(_SERVER, "StreamIsActive", kind).inc()
                        yield pb.IsActiveResponse(result=active)
                        sent, heartbeat_at = active, now + self._heartbeat
                    # Reading the cache each heartbeat also keeps the series warm while a client listens.
                    wait = max(heartbeat_at - loop.time(), 0.0) if sent is not None else self._heartbeat
                    try:
                        async with asyncio.timeout(wait):
                            await updated.wait()
                    except TimeoutError:
                        pass
            finally:
                unsubscribe()

    async def _current_activity(self, trigger: Trigger) -> bool | None:
        """Active or not from the cache; None while the value is unavailable (no message beats a made-up one)."""
        try:
            return self._active(trigger, await self._read(trigger))
        except MetricUnavailable as err:
            log.info("StreamIsActive for %s: no value to push: %s", trigger.metric, err.message)
            return None

    async def StreamMetricSpec(
        self,
        request: pb.ScaledObjectRef,
        context: Context,
    ) -> AsyncIterator[pb.GetMetricSpecResponse]:
        """The specs now; they come from the trigger's own metadata, so they never change while it is open."""
        try:
            spec = self._spec(parse_trigger(request, self._config))
        except MetricError as err:
            await self._fail(context, "StreamMetricSpec", err)
            return
        async with self.slots.hold(context, "StreamMetricSpec") as closing:
            telemetry.STREAM_MESSAGES.labels(_SERVER, "StreamMetricSpec", "change").inc()
            yield spec
            await closing.wait()  # open until the client leaves or the server stops


async def start_scaler(config: ScalerServerConfig, cache: MetricCache) -> RunningServer | None:
    """The KEDA external scaler server, or None when grpc.scaler is not enabled."""
    if not config.enabled:
        return None
    servicer = ExternalScaler(cache, config)
    return await start_server(
        config,
        _SERVER,
        lambda server: pb_grpc.add_ExternalScalerServicer_to_server(servicer, server),  # type: ignore[no-untyped-call]
        [SERVICE],
        servicer.slots,
        [TracingInterceptor(SERVICE, tracing.KEDA_CALLS)],
    )
