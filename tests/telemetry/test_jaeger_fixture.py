"""The Jaeger fixture end to end: spans exported by the OpenTelemetry SDK over OTLP/HTTP come back from Jaeger's
query API with their parent/child link, attributes and events; a taken port is seen as taken (so the fixture
starts again elsewhere) and a stopped Jaeger is gone."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from adapter.children import ChildFailed, listening, port_outside_ephemeral
from adapter.demo.jaeger import JaegerPorts, Span
from tests.fixtures.jaeger import Jaeger, build_jaeger, export_parent_and_child

SERVICE = "jaeger-fixture-test"


def test_a_trace_comes_back_with_its_links_and_events(jaeger: Jaeger) -> None:
    trace_id, parent_id, child_id = export_parent_and_child(jaeger.otlp_traces_endpoint, SERVICE)
    spans = {span.name: span for span in jaeger.trace(trace_id, until=lambda spans: len(spans) == 2)}
    parent, child = spans["request"], spans["wait"]
    assert (parent.span_id, parent.parent_span_id, parent.service) == (parent_id, "", SERVICE)
    assert (child.span_id, child.parent_span_id, child.trace_id) == (child_id, parent_id, trace_id)
    assert parent.attributes["route"] == "web"
    events = [(event.name, event.attributes) for event in child.events]
    assert events == [("held", {"held.requests": 3}), ("forwarded", {})]
    assert parent.start_ns <= child.start_ns <= child.events[0].time_ns <= child.end_ns <= parent.end_ns


def test_a_service_s_traces_are_found(jaeger: Jaeger) -> None:
    service = f"{SERVICE}-search"
    trace_id, _, _ = export_parent_and_child(jaeger.otlp_traces_endpoint, service)

    def both_spans(spans: list[Span]) -> bool:
        return len([span for span in spans if span.trace_id == trace_id]) == 2

    spans = jaeger.traces(service, until=both_spans)
    assert {span.service for span in spans} == {service}


def test_a_trace_not_there_is_reported_by_its_id(jaeger: Jaeger, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("tests.fixtures.jaeger.TRACE_WAIT_S", 0.5)
    with pytest.raises(AssertionError, match=r"trace 0123456789abcdef0123456789abcdef not there after 0\.5s"):
        jaeger.trace("0123456789abcdef0123456789abcdef")


def test_a_taken_port_fails_at_once_as_taken(tmp_path: Path) -> None:
    """What `Jaeger.start` relies on to start again on other ports: Jaeger exits saying the address is in use."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        jaeger = Jaeger(build_jaeger(), tmp_path)
        free = [port_outside_ephemeral() for _ in range(3)]
        with pytest.raises(ChildFailed, match="exited with code") as failed:
            jaeger.start_on(JaegerPorts(free[0], free[1], taken, free[2]))
    assert failed.value.port_taken, failed.value.tail


def test_stop_ends_the_process_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    jaeger = Jaeger(build_jaeger(), tmp_path).start()
    process = jaeger.process
    assert listening(process.pid, jaeger.ports.otlp_http)
    # A query first: Jaeger traces its own queries unless its config says not to, and then spends ~10 s of its
    # shutdown trying to send them to localhost:4317, past stop()'s patience.
    monkeypatch.setattr("tests.fixtures.jaeger.TRACE_WAIT_S", 0.1)
    with pytest.raises(AssertionError, match="not there"):
        jaeger.trace("0123456789abcdef0123456789abcdef")
    jaeger.stop()
    assert process.returncode == 0, "not a clean exit on SIGTERM (killed after stop()'s 10 s?)"
    assert listening(process.pid, jaeger.ports.otlp_http) is None
