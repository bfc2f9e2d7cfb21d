"""Time every unary gRPC call into zeroscale_grpc_request_duration_seconds (streams live too long to time)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from adapter.telemetry import rpc as telemetry


class LatencyInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    def __init__(self, server: str) -> None:
        self._server = server

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        handler = await continuation(handler_call_details)
        if handler is None or handler.unary_unary is None:
            return handler
        method = handler_call_details.method.rsplit("/", 1)[-1]
        histogram = telemetry.GRPC_REQUEST_SECONDS.labels(self._server, method)
        behaviour = handler.unary_unary

        async def timed(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            started = time.perf_counter()
            try:
                return await behaviour(request, context)  # type: ignore[arg-type]  # an aio handler
            finally:
                histogram.observe(time.perf_counter() - started)

        return grpc.unary_unary_rpc_method_handler(
            timed,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
