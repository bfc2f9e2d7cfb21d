"""Summary figures and the HTML report, from a hand-made timeline with known answers."""

from __future__ import annotations

from pathlib import Path

from adapter.demo.observe import held_from_exposition
from adapter.demo.report import percentile, summarize, summary_lines, write_report
from adapter.demo.scenario import Outcome
from adapter.demo.timeline import BrowserVisit, RequestResult, Sample, Timeline


def _timeline(paths: dict[str, list[int]], requests: list[RequestResult]) -> Timeline:
    timeline = Timeline()
    steps = max(len(p) for p in paths.values())
    for i in range(steps):
        replicas = {name: path[min(i, len(path) - 1)] for name, path in paths.items()}
        timeline.samples.append(Sample(float(i), replicas, replicas, i % 3))
    timeline.requests.extend(requests)
    timeline.metric_values["worker"] = [(0.0, 0.0), (1.0, 40.0), (2.0, None), (3.0, 0.0)]
    timeline.phase("idle")
    return timeline


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.0
    assert percentile(values, 95) == 95.0
    assert percentile(values, 99) == 99.0
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([], 50) is None


def test_summary_counts_cold_waits_and_lost_requests() -> None:
    requests = [RequestResult(1.0, s, True, True) for s in (0.5, 0.7, 0.9)]
    requests += [RequestResult(2.0, 0.01, True, False), RequestResult(2.0, 0.01, False, False, "HTTP/1.1 504")]
    timeline = _timeline({"web": [0, 1, 3, 0], "worker": [0, 4, 0]}, requests)
    summary = summarize("smoke", timeline, Outcome(jobs_pushed=10, jobs_done=10))
    assert (summary.requests, summary.requests_ok, summary.requests_lost, summary.cold_requests) == (5, 4, 1, 3)
    assert (summary.cold_wait_p50, summary.cold_wait_p99) == (0.7, 0.9)
    assert summary.replica_paths == {"web": [0, 1, 3, 0], "worker": [0, 4, 0]}
    assert summary.errors == ["HTTP/1.1 504"]
    assert not summary.passed  # one request lost


def test_passed_needs_every_workload_back_at_zero_and_every_job_done() -> None:
    ok = [RequestResult(1.0, 0.5, True, True)]
    assert summarize("s", _timeline({"web": [0, 1, 0], "worker": [0, 2, 0]}, ok), Outcome(5, 5)).passed
    assert not summarize("s", _timeline({"web": [0, 1, 1], "worker": [0, 2, 0]}, ok), Outcome(5, 5)).passed
    assert not summarize("s", _timeline({"web": [0, 0], "worker": [0, 2, 0]}, ok), Outcome(5, 5)).passed
    assert not summarize("s", _timeline({"web": [0, 1, 0], "worker": [0, 2, 0]}, ok), Outcome(5, 4)).passed


def test_report_is_self_contained_html_with_four_plots(tmp_path: Path) -> None:
    timeline = _timeline({"web": [0, 1, 0], "worker": [0, 2, 0]}, [RequestResult(1.0, 0.5, True, True)])
    summary = summarize("smoke", timeline, Outcome(5, 5))
    path = write_report(tmp_path, summary, timeline, ["sync 1s"])
    text = path.read_text()
    assert text.count("<svg") == 4
    assert "http://" not in text.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "<script" not in text
    assert "PASSED" in text
    assert '"passed": true' in (tmp_path / "summary.json").read_text()


def test_held_requests_read_from_the_proxy_gauge() -> None:
    exposition = (
        "# HELP zeroscale_proxy_held_requests Requests waiting for a ready endpoint\n"
        "# TYPE zeroscale_proxy_held_requests gauge\n"
        'zeroscale_proxy_held_requests{route="api"} 2.0\n'
        'zeroscale_proxy_held_requests{route="web"} 7.0\n'
    )
    assert held_from_exposition(exposition, "web") == 7
    assert held_from_exposition(exposition, "other") is None


def test_a_browser_visit_passes_only_with_the_waking_page_and_then_the_app() -> None:
    served = _timeline({"web": [0, 1, 0], "worker": [0, 2, 0]}, [RequestResult(1.0, 0.5, True, True)])
    served.visits.append(BrowserVisit(1.0, 0.004, 2.5, 2))
    summary = summarize("s", served, Outcome(5, 5))
    assert summary.passed
    assert "browser: the waking page after 0.00s, the app after 2 reload(s) (2.50s)" in summary_lines(summary)
    held = _timeline({"web": [0, 1, 0], "worker": [0, 2, 0]}, [RequestResult(1.0, 0.5, True, True)])
    held.visits.append(BrowserVisit(1.0, None, 2.5, 0))  # the browser was held like a program: no page
    assert not summarize("s", held, Outcome(5, 5)).passed
