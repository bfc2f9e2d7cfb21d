"""A "pod" of a gRPC workload, as the kubelet stand-in runs one: a real grpcio server on this machine's own address
(an EndpointSlice may not name a loopback one) that speaks HTTP/2 only, as every gRPC server does.

It serves `zeroscale.e2e.Echo/Say` (raw bytes in and out: a generic handler, no generated code), answering
"<pod> heard <request>", and the standard health service (grpc.health.v1), which is what a Kubernetes gRPC readiness
probe asks. It starts NOT_SERVING, as a server loading its model does, until the test says `loaded()`: so the test,
not a timer, decides how long a call waits for it. `calls` records every Say that arrived, in arrival order.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from tests.e2e.test_04_proxy_wake import pod_address

SERVICE = "zeroscale.e2e.Echo"
SAY = f"/{SERVICE}/Say"
SERVING = health_pb2.HealthCheckResponse.SERVING
PROBE_TIMEOUT = 1.0  # kubelet's default timeoutSeconds


def answer(pod: str, request: bytes) -> bytes:
    """What the pod named `pod` answers to Say(`request`)."""
    return f"{pod} heard ".encode() + request


class GrpcPod:
    def __init__(self, name: str) -> None:
        self.name = name
        self.address = pod_address()
        self.calls: list[bytes] = []
        self._lock = threading.Lock()
        self._health = health.HealthServicer()
        self._health.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        self._server = grpc.server(ThreadPoolExecutor(4, thread_name_prefix=f"pod {name}"))
        say = grpc.unary_unary_rpc_method_handler(self._say)
        self._server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(SERVICE, {"Say": say})])
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)
        self.port: int = self._server.add_insecure_port(f"{self.address}:0")
        self._server.start()

    def _say(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        with self._lock:
            self.calls.append(request)
        return answer(self.name, request)

    def loaded(self) -> None:
        """The model is loaded: the health service says SERVING from now on."""
        self._health.set("", SERVING)

    def ready(self) -> bool:
        """kubelet's gRPC readiness probe: grpc.health.v1 Check of the whole server (service "") reads SERVING."""
        with grpc.insecure_channel(f"{self.address}:{self.port}") as channel:
            check = health_pb2_grpc.HealthStub(channel).Check
            try:
                return bool(check(health_pb2.HealthCheckRequest(service=""), timeout=PROBE_TIMEOUT).status == SERVING)
            except grpc.RpcError:
                return False

    def stop(self) -> None:
        """Stop listening; calls being answered get a second to finish."""
        self._server.stop(grace=1.0).wait()
