"""`zeroscale demo --with-jaeger`'s reading of the traces (adapter/demo/jaeger.py): every trace of the demo's
processes saved from a real Jaeger, and the slowest request's trace drawn as text, children under their parents and
events at their offsets."""

from __future__ import annotations

import json
from pathlib import Path

from adapter.demo.jaeger import SERVICES, Event, Span, save_traces, spans_of, trace_lines
from tests.fixtures.jaeger import Jaeger, build_jaeger, export_parent_and_child

PROXY, ADAPTER = SERVICES


def _both_spans(spans: list[Span]) -> bool:
    return len(spans) == 2


def test_every_trace_is_saved_and_the_slowest_request_drawn(tmp_path: Path) -> None:
    jaeger = Jaeger(build_jaeger(), tmp_path / "jaeger").start()
    try:
        saved = tmp_path / "traces.json"
        assert save_traces(jaeger.query_url, saved) == [f"traces in Jaeger: {PROXY} 0, {ADAPTER} 0 (saved in {saved})"]
        export_parent_and_child(jaeger.otlp_traces_endpoint, PROXY)
        slow, parent_id, child_id = export_parent_and_child(jaeger.otlp_traces_endpoint, PROXY, held_s=0.3)
        export_parent_and_child(jaeger.otlp_traces_endpoint, ADAPTER)
        jaeger.traces(PROXY, until=lambda spans: len(spans) == 4)
        jaeger.traces(ADAPTER, until=_both_spans)
        lines = save_traces(jaeger.query_url, saved)
    finally:
        jaeger.stop()
    assert lines[:2] == [
        f"traces in Jaeger: {PROXY} 2, {ADAPTER} 1 (saved in {saved})",
        "the slowest request's trace (a cold start):",
    ]
    assert lines[2].startswith(f"trace {slow}: 3")  # 300-odd ms
    assert lines[3].startswith(f"  {PROXY} request: +0.0 ms, 3")
    assert lines[4].startswith(f"    {PROXY} wait: +")
    assert " [held +" in lines[4]
    assert ", forwarded +3" in lines[4]
    assert len(lines) == 5
    answers = json.loads(saved.read_text())
    ids = {span.span_id for span in spans_of(answers[PROXY]["result"])}
    assert {parent_id, child_id} <= ids
    assert len(answers[ADAPTER]["result"]["resourceSpans"]) == 1


def _span(name: str, span_id: str, parent: str, start_ms: int, end_ms: int, *events: tuple[str, int]) -> Span:
    ms = 1_000_000
    marks = tuple(Event(event, at * ms, {}) for event, at in events)
    return Span("zeroscale-proxy", name, "ab" * 16, span_id, parent, start_ms * ms, end_ms * ms, {}, marks)


def test_a_trace_is_drawn_children_under_parents_in_start_order() -> None:
    spans = [
        _span("forward", "c2", "p", 700, 900, ("first_byte", 850)),
        _span("proxy.request", "p", "", 0, 1000, ("held", 1), ("forwarded", 700)),
        _span("wake", "c1", "p", 2, 10),
        # Its parent is another process's, not in this trace: drawn as a root.
        _span("upstream", "u", "elsewhere", 710, 880),
    ]
    assert trace_lines(spans) == [
        f"trace {'ab' * 16}: 1000.0 ms",
        "  zeroscale-proxy proxy.request: +0.0 ms, 1000.0 ms [held +1.0 ms, forwarded +700.0 ms]",
        "    zeroscale-proxy wake: +2.0 ms, 8.0 ms",
        "    zeroscale-proxy forward: +700.0 ms, 200.0 ms [first_byte +850.0 ms]",
        "  zeroscale-proxy upstream: +710.0 ms, 170.0 ms",
    ]
    assert trace_lines([]) == []
