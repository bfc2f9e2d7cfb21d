"""Requests the servicer never sees: from a certificate not allowed here, too large, or not the method's message.

With `client_names` configured, a caller whose verified certificate names none of them is refused
PERMISSION_DENIED before the servicer sees its request: every installation's parts share one CA, so "signed
by the CA" alone would let KEDA's certificate subscribe to counts and the adapter's call the scaler.

gRPC would log each undecodable request with a full traceback, so any peer could fill the log at
will, and it refuses a large one with a message that names no setting. The interceptor wraps each
method's deserializer: bytes above `max_message_bytes`, or bytes it cannot decode, become a
`_Refusal`, which the wrapped method answers (counted, one throttled log line) instead of calling
the servicer. Nothing above the bound is decoded; gRPC itself refuses what is far above it
(`CORE_LIMIT_FACTOR` times) before reading it whole.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, NoReturn, TypeAlias

import grpc

from adapter.telemetry import rpc as telemetry
from adapter.telemetry.throttle import LogThrottle, held_back

log = logging.getLogger(__name__)
_throttle = LogThrottle(10.0)

# gRPC's own limit, as a multiple of max_message_bytes: a backstop that keeps memory bounded.
CORE_LIMIT_FACTOR = 4

Handler: TypeAlias = "grpc.RpcMethodHandler[Any, Any]"  # not subscriptable at run time
_Context = grpc.aio.ServicerContext[Any, Any]


@dataclass(frozen=True)
class _Refusal:
    code: grpc.StatusCode
    message: str


def certificate_names(context: _Context) -> list[str]:
    """The names gRPC verified in the peer's certificate (subjectAltNames, else the common name)."""
    return [name.decode("utf-8", "replace") for name in context.peer_identities() or ()]


class RequestGuard(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    def __init__(self, server: str, max_message_bytes: int, client_names: frozenset[str] = frozenset()) -> None:
        self._server = server
        self._limit = max_message_bytes
        self._names = client_names

    def _stranger(self, context: _Context) -> _Refusal | None:
        """PERMISSION_DENIED for a caller whose certificate names none of `client_names` (when set)."""
        if not self._names:
            return None
        names = certificate_names(context)
        if self._names.intersection(names):
            return None
        return _Refusal(
            grpc.StatusCode.PERMISSION_DENIED,
            f"a client certificate for {', '.join(names) or 'no name'} may not call this server "
            f"(grpc.{self._server}.tls.client_names)",
        )

    def _reader(self, method: str, deserialize: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
        if deserialize is None:
            return None
        limit, key = self._limit, f"grpc.{self._server}.max_message_bytes"

        def read(data: bytes) -> Any:
            if len(data) > limit:
                return _Refusal(
                    grpc.StatusCode.RESOURCE_EXHAUSTED, f"a request of {len(data)} bytes is over {key} ({limit})"
                )
            try:
                return deserialize(data)
            except Exception:  # whatever the decoder raises, the bytes were not a message
                return _Refusal(grpc.StatusCode.INVALID_ARGUMENT, f"the request is not a valid {method} message")

        return read

    async def _refuse(self, method: str, refusal: _Refusal, context: _Context) -> NoReturn:
        telemetry.GRPC_REQUESTS.labels(self._server, method, refusal.code.name).inc()
        held = _throttle.allow((self._server, method, refusal.code))
        if held is not None:
            log.warning("grpc.%s: %s refused: %s%s", self._server, method, refusal.message, held_back(held))
        await context.abort(refusal.code, refusal.message)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Handler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        method = handler_call_details.method.rsplit("/", 1)[-1]
        refuse, stranger = self._refuse, self._stranger

        def refusal_of(request: Any, context: _Context) -> _Refusal | None:
            """Who calls comes first: a stranger is refused whatever it sent."""
            return stranger(context) or (request if isinstance(request, _Refusal) else None)

        reader = self._reader(method, handler.request_deserializer)
        if handler.unary_unary is not None:
            unary: Any = handler.unary_unary  # an aio method: awaitable

            async def guarded_unary(request: Any, context: _Context) -> Any:
                refusal = refusal_of(request, context)
                if refusal is not None:
                    await refuse(method, refusal, context)
                return await unary(request, context)

            return grpc.unary_unary_rpc_method_handler(
                guarded_unary, request_deserializer=reader, response_serializer=handler.response_serializer
            )
        if handler.unary_stream is not None:
            stream: Any = handler.unary_stream  # an aio method: async generator or writer
            guarded: Callable[[Any, _Context], Any]
            if inspect.isasyncgenfunction(stream):

                async def guarded_generator(request: Any, context: _Context) -> AsyncIterator[Any]:
                    refusal = refusal_of(request, context)
                    if refusal is not None:
                        await refuse(method, refusal, context)
                    async for message in stream(request, context):
                        yield message

                guarded = guarded_generator
            else:  # a method that writes with context.write (grpc.health.v1's Watch)

                async def guarded_writer(request: Any, context: _Context) -> None:
                    refusal = refusal_of(request, context)
                    if refusal is not None:
                        await refuse(method, refusal, context)
                    await stream(request, context)

                guarded = guarded_writer
            return grpc.unary_stream_rpc_method_handler(
                guarded, request_deserializer=reader, response_serializer=handler.response_serializer
            )
        return handler  # no client-streaming methods are served
