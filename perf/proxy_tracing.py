"""The tracing part of perf/proxy_bench.py: what a request pays for traces, off and at three sampling ratios.

The proxies export to a stand-in OTLP/HTTP collector in this process (`Collector`): it answers every POST to
/v1/traces with an empty `ExportTraceServiceResponse` and counts the spans it was sent, so the bench measures the
proxy's own cost (span, events, context, the export thread) and not a tracing backend's, and can say that the
spans did leave. wrk sends no `traceparent`: the ratio alone decides what is sampled.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

# Label -> the proxy's tracing settings (environment overrides); "off" is the baseline every other is against.
SETTINGS: dict[str, dict[str, str]] = {
    "off": {},
    "ratio_0": {"ZEROSCALE_TRACING__SAMPLE_RATIO": "0"},
    "ratio_001": {"ZEROSCALE_TRACING__SAMPLE_RATIO": "0.01"},
    "ratio_1": {"ZEROSCALE_TRACING__SAMPLE_RATIO": "1"},
}


class Collector(ThreadingHTTPServer):
    """A stand-in OTLP/HTTP trace collector on a loopback port: accepts, counts, keeps nothing."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.spans = 0
        self.lock = threading.Lock()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1/traces"


class _Handler(BaseHTTPRequestHandler):
    server: Collector

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        request = ExportTraceServiceRequest.FromString(body)
        count = sum(len(scope.spans) for resource in request.resource_spans for scope in resource.scope_spans)
        with self.server.lock:
            self.server.spans += count
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:  # quiet: a line per export
        pass


@contextmanager
def collector() -> Iterator[Collector]:
    server = Collector()
    thread = threading.Thread(target=server.serve_forever, name="otlp-collector", daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def environment(label: str, endpoint: str) -> dict[str, str]:
    """The proxy's environment for setting `label`, exporting to `endpoint` when tracing is on."""
    if label == "off":
        return {}
    return {"ZEROSCALE_TRACING__ENABLED": "true", "ZEROSCALE_TRACING__ENDPOINT": endpoint, **SETTINGS[label]}
