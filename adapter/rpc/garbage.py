"""Requests that are not the method's message: INVALID_ARGUMENT and one throttled log line, no traceback.

gRPC would log each undecodable request with a full traceback, so any peer could fill the log at
will. The interceptor wraps each method's deserializer: bytes it cannot decode become `_GARBAGE`,
and the wrapped method answers that instead of calling the servicer.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NoReturn, TypeAlias

import grpc

from adapter.telemetry import rpc as telemetry
from adapter.telemetry.throttled import ThrottledLog

log = logging.getLogger(__name__)
_throttled = ThrottledLog(log)

_GARBAGE = object()
Handler: TypeAlias = "grpc.RpcMethodHandler[Any, Any]"  # not subscriptable at run time
_Context = grpc.aio.ServicerContext[Any, Any]


def _safe(deserialize: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    if deserialize is None:
        return None

    def read(data: bytes) -> Any:
        try:
            return deserialize(data)
        except Exception:  # whatever the decoder raises, the bytes were not a message
            return _GARBAGE

    return read


class GarbageInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    def __init__(self, server: str) -> None:
        self._server = server

    async def _refuse(self, method: str, context: _Context) -> NoReturn:
        telemetry.GRPC_REQUESTS.labels(self._server, method, grpc.StatusCode.INVALID_ARGUMENT.name).inc()
        _throttled.warn(f"{self._server}/{method}", "grpc.%s: %s got a request it cannot decode", self._server, method)
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"the request is not a valid {method} message")

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Handler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        method = handler_call_details.method.rsplit("/", 1)[-1]
        refuse = self._refuse
        if handler.unary_unary is not None:
            unary: Any = handler.unary_unary  # an aio method: awaitable

            async def guarded_unary(request: Any, context: _Context) -> Any:
                if request is _GARBAGE:
                    await refuse(method, context)
                return await unary(request, context)

            return grpc.unary_unary_rpc_method_handler(
                guarded_unary,
                request_deserializer=_safe(handler.request_deserializer),
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream is not None:
            stream: Any = handler.unary_stream  # an aio method: async generator or writer
            guarded: Callable[[Any, _Context], Any]
            if inspect.isasyncgenfunction(stream):

                async def guarded_generator(request: Any, context: _Context) -> AsyncIterator[Any]:
                    if request is _GARBAGE:
                        await refuse(method, context)
                    async for message in stream(request, context):
                        yield message

                guarded = guarded_generator
            else:  # a method that writes with context.write (grpc.health.v1's Watch)

                async def guarded_writer(request: Any, context: _Context) -> None:
                    if request is _GARBAGE:
                        await refuse(method, context)
                    await stream(request, context)

                guarded = guarded_writer
            return grpc.unary_stream_rpc_method_handler(
                guarded,
                request_deserializer=_safe(handler.request_deserializer),
                response_serializer=handler.response_serializer,
            )
        return handler  # no client-streaming methods are served
