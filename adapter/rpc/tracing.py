"""SERVER spans of a gRPC service's calls, continuing the caller's `traceparent` (from the call's metadata).

The span is handed to the servicer through a context variable of the call's own task (`call_span`), not made the
OpenTelemetry current span: the cache and the sources take their parent explicitly (adapter/telemetry/reads.py),
and a task started during the call (a source's poller) must not inherit the call as its parent for its lifetime.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import grpc
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind

from adapter.rpc.guard import Handler
from adapter.telemetry import reads as spans
from adapter.telemetry import tracing

_Context = grpc.aio.ServicerContext[Any, Any]
# Codes that are the server's failure, not the caller's (OpenTelemetry's gRPC conventions): the span is an error.
_SERVER_ERRORS = frozenset(
    {
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DATA_LOSS,
    }
)
_CALL: ContextVar[Span | None] = ContextVar("zeroscale_grpc_call_span", default=None)


def call_span() -> Span | None:
    """The span of the call being served (None: tracing off, or a call not traced)."""
    return _CALL.get()


class TracingInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    """A span per call of `service`'s methods named in `names` (method -> span name); other calls pass untouched,
    and so does every call while tracing is off."""

    def __init__(self, service: str, names: Mapping[str, str]) -> None:
        self._prefix = f"/{service}/"
        self._service = service
        self._names = names

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Handler:
        handler = await continuation(handler_call_details)
        tracer = tracing.TRACER
        if tracer is None or handler is None or not handler_call_details.method.startswith(self._prefix):
            return handler
        method = handler_call_details.method[len(self._prefix) :]
        name = self._names.get(method)
        if name is None:
            return handler
        metadata = {k: v for k, v in handler_call_details.invocation_metadata or () if isinstance(v, str)}
        parent = tracing.parent_of(metadata.get("traceparent"), metadata.get("tracestate")) or Context()
        attributes = {tracing.RPC_SYSTEM: "grpc", tracing.RPC_SERVICE: self._service, tracing.RPC_METHOD: method}

        @contextmanager
        def serving(context: _Context) -> Iterator[None]:
            span = tracer.start_span(name, context=parent, kind=SpanKind.SERVER, attributes=attributes)
            _CALL.set(span)  # in the call's own task, which ends with it: nothing to reset
            code, details = grpc.StatusCode.OK, ""
            try:
                yield
            except grpc.aio.AbortError:
                code, details = context.code(), context.details()
                raise
            except asyncio.CancelledError:  # the caller left (a stream closed) or the server stops
                code = grpc.StatusCode.CANCELLED
                raise
            except Exception as err:  # gRPC answers UNKNOWN
                span.record_exception(err)
                code, details = grpc.StatusCode.UNKNOWN, f"{type(err).__name__}: {err}"
                raise
            finally:
                _ended(span, code, details)

        traced = _unary(handler, serving) if handler.unary_unary is not None else _stream(handler, serving)
        return traced or handler


_Serving = Callable[[_Context], Any]  # the context manager `serving` above


def _unary(handler: Handler, serving: _Serving) -> Handler:
    behaviour: Any = handler.unary_unary  # an aio method: awaitable

    async def traced(request: Any, context: _Context) -> Any:
        with serving(context):
            return await behaviour(request, context)

    return grpc.unary_unary_rpc_method_handler(
        traced, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer
    )


def _stream(handler: Handler, serving: _Serving) -> Handler | None:
    stream: Any = handler.unary_stream
    if not inspect.isasyncgenfunction(stream):
        return None  # no such method is traced (grpc.health.v1's Watch writes with context.write)

    async def traced(request: Any, context: _Context) -> AsyncIterator[Any]:
        with serving(context):
            async for message in stream(request, context):
                yield message

    return grpc.unary_stream_rpc_method_handler(
        traced, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer
    )


def _ended(span: Span, code: grpc.StatusCode | None, details: str | None) -> None:
    code = code or grpc.StatusCode.OK  # an abort always sets one; a return leaves None
    span.set_attribute(tracing.RPC_STATUS, code.value[0])
    if code in _SERVER_ERRORS:
        spans.failed(span, details or code.name)
    span.end()
