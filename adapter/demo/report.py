"""The demo's ending: a summary (cold-start waits, requests lost, each workload's path) and an HTML report.

The report is one self-contained file: plots are inline SVG drawn here, no script, no network.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from adapter.demo.scenario import Outcome
from adapter.demo.timeline import Timeline

_COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e")
_WIDTH, _HEIGHT, _PAD = 760, 220, 44


def percentile(values: Sequence[float], p: float) -> float | None:
    """Nearest rank: the smallest value with at least p% of the values at or below it."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


@dataclass(frozen=True)
class Summary:
    scenario: str
    seconds: float
    requests: int
    requests_ok: int
    requests_lost: int
    cold_requests: int
    cold_wait_p50: float | None
    cold_wait_p95: float | None
    cold_wait_p99: float | None
    jobs_pushed: int
    jobs_done: int
    kafka_messages: int
    kafka_consumed: int
    replica_paths: dict[str, list[int]]
    peaks: dict[str, int]
    timeouts: list[str]
    errors: list[str]
    # A person's browser visits while the app was at zero: (seconds to the waking page, to the app, reloads, error).
    visits: list[tuple[float | None, float | None, int, str]]

    @property
    def passed(self) -> bool:
        """Every workload went 0 -> >=1 -> 0, no request was lost, every job and message was done, and every browser
        got the waking page and then the app."""
        paths = self.replica_paths.values()
        round_trips = all(path[:1] == [0] and path[-1:] == [0] and max(path) >= 1 for path in paths)
        everything_done = self.jobs_done == self.jobs_pushed and self.kafka_consumed == self.kafka_messages
        browsers_served = all(page is not None and app is not None for page, app, _, _ in self.visits)
        return round_trips and self.requests_lost == 0 and everything_done and browsers_served and not self.timeouts


def summarize(scenario: str, timeline: Timeline, outcome: Outcome) -> Summary:
    requests = timeline.requests
    cold = [r.seconds for r in requests if r.cold and r.ok]
    workloads = sorted(timeline.samples[-1].replicas) if timeline.samples else []
    paths = {name: timeline.replica_path(name) for name in workloads}
    errors = sorted({r.error for r in requests if not r.ok})
    return Summary(
        scenario=scenario,
        seconds=round(timeline.now(), 1),
        requests=len(requests),
        requests_ok=sum(1 for r in requests if r.ok),
        requests_lost=sum(1 for r in requests if not r.ok),
        cold_requests=sum(1 for r in requests if r.cold),
        cold_wait_p50=percentile(cold, 50),
        cold_wait_p95=percentile(cold, 95),
        cold_wait_p99=percentile(cold, 99),
        jobs_pushed=outcome.jobs_pushed,
        jobs_done=outcome.jobs_done,
        kafka_messages=outcome.kafka_messages,
        kafka_consumed=outcome.kafka_consumed,
        replica_paths=paths,
        peaks={name: max(path) for name, path in paths.items()},
        timeouts=list(outcome.timeouts),
        errors=errors,
        visits=[(v.page_seconds, v.app_seconds, v.reloads, v.error) for v in timeline.visits],
    )


def _seconds(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}s"


def summary_lines(summary: Summary) -> list[str]:
    lines = [
        f"scenario {summary.scenario}: {summary.seconds:g}s",
        f"requests: {summary.requests} sent, {summary.requests_ok} answered 200, {summary.requests_lost} lost",
        f"cold-start wait ({summary.cold_requests} requests arrived at zero): "
        f"p50 {_seconds(summary.cold_wait_p50)}  p95 {_seconds(summary.cold_wait_p95)}  "
        f"p99 {_seconds(summary.cold_wait_p99)}",
        f"jobs: {summary.jobs_pushed} pushed, {summary.jobs_done} done",
    ]
    if summary.kafka_messages:
        lines.append(f"kafka: {summary.kafka_messages} messages produced, {summary.kafka_consumed} consumed")
    for page, app, reloads, error in summary.visits:
        lines.append(
            f"browser: the waking page after {_seconds(page)}, the app after {reloads} reload(s) ({_seconds(app)})"
            + (f": {error}" if error else "")
        )
    for name, path in summary.replica_paths.items():
        lines.append(f"{name} replicas: {' -> '.join(map(str, path))}")
    lines += [f"timed out: {t}" for t in summary.timeouts]
    lines += [f"lost request: {e}" for e in summary.errors]
    return lines


# --- HTML ---


def _svg(title: str, series: dict[str, list[tuple[float, float]]], x_max: float, *, step: bool, dots: bool) -> str:
    """One plot: lines (or dots) per series, x in seconds, axes with a few ticks."""
    y_max = max((y for points in series.values() for _, y in points), default=0.0)
    y_top = max(1.0, y_max * 1.1)
    x_top = max(1.0, x_max)
    plot_w, plot_h = _WIDTH - 2 * _PAD, _HEIGHT - 2 * _PAD

    def sx(x: float) -> float:
        return _PAD + x / x_top * plot_w

    def sy(y: float) -> float:
        return _HEIGHT - _PAD - y / y_top * plot_h

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_WIDTH}" height="{_HEIGHT}" '
        'font-family="sans-serif" role="img">',
        f"<title>{html.escape(title)}</title>",
        f'<text x="{_PAD}" y="18" font-size="14" font-weight="bold">{html.escape(title)}</text>',
        f'<rect x="{_PAD}" y="{_PAD}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#ccc"/>',
    ]
    for i in range(5):
        y = y_top * i / 4
        parts.append(f'<text x="{_PAD - 6}" y="{sy(y) + 4:.1f}" font-size="10" text-anchor="end">{y:.3g}</text>')
        parts.append(f'<line x1="{_PAD}" x2="{_WIDTH - _PAD}" y1="{sy(y):.1f}" y2="{sy(y):.1f}" stroke="#eee"/>')
        x = x_top * i / 4
        parts.append(
            f'<text x="{sx(x):.1f}" y="{_HEIGHT - _PAD + 14}" font-size="10" text-anchor="middle">{x:.0f}s</text>'
        )
    for n, (name, points) in enumerate(series.items()):
        colour = _COLOURS[n % len(_COLOURS)]
        if dots:
            parts += [f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.5" fill="{colour}"/>' for x, y in points]
        elif points:
            coords: list[str] = []
            for i, (x, y) in enumerate(points):
                if step and i:
                    coords.append(f"{sx(x):.1f},{sy(points[i - 1][1]):.1f}")
                coords.append(f"{sx(x):.1f},{sy(y):.1f}")
            parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="{" ".join(coords)}"/>')
        parts.append(
            f'<text x="{_WIDTH - _PAD - 4}" y="{_PAD + 14 + 14 * n}" font-size="12" text-anchor="end" '
            f'fill="{colour}">{html.escape(name)}</text>'
        )
    parts.append("</svg>")
    return "\n".join(parts)


def render_html(summary: Summary, timeline: Timeline, notes: Sequence[str]) -> str:
    x_max = timeline.now()
    samples = timeline.samples
    replicas = {name: [(s.at, float(s.replicas[name])) for s in samples] for name in summary.replica_paths}
    depth = {
        name: [(at, value) for at, value in values if value is not None]
        for name, values in timeline.metric_values.items()
        if name != "web"
    }
    held = {"held by the proxy": [(s.at, float(s.held)) for s in samples if s.held is not None]}
    waits = {
        "cold start (arrived at zero)": [(r.sent_at, r.seconds) for r in timeline.requests if r.cold and r.ok],
        "warm": [(r.sent_at, r.seconds) for r in timeline.requests if not r.cold and r.ok],
    }
    plots = [
        _svg("Replicas (wanted) per workload", replicas, x_max, step=True, dots=False),
        _svg("Queue depth the HPAs read (jobs in Redis, Kafka lag)", depth, x_max, step=True, dots=False),
        _svg("Requests held by the proxy", held, x_max, step=True, dots=False),
        _svg("Request waits (seconds) by send time", waits, x_max, step=False, dots=True),
    ]
    phases = "".join(f"<li>{at:.1f}s: {html.escape(name)}</li>" for at, name in timeline.phases)
    events = "".join(
        f"<li>{e.at:.1f}s {html.escape(e.workload)} {e.before} &rarr; {e.after} by {e.by}: {html.escape(e.why)}</li>"
        for e in timeline.events
    )
    summary_html = "".join(f"<li>{html.escape(line)}</li>" for line in summary_lines(summary))
    notes_html = "".join(f"<li>{html.escape(note)}</li>" for note in notes)
    verdict = "PASSED" if summary.passed else "FAILED"
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>zeroscale demo: {verdict}</title>
<style>body{{font-family:sans-serif;max-width:820px;margin:2em auto}} svg{{display:block;margin:1em 0}}</style>
</head><body>
<h1>zeroscale demo ({html.escape(summary.scenario)}): {verdict}</h1>
<ul>{summary_html}</ul>
<h2>How it ran</h2><ul>{notes_html}</ul>
{"".join(plots)}
<h2>Phases</h2><ol>{phases}</ol>
<h2>Scale events</h2><ol>{events}</ol>
</body></html>
"""


def write_report(run_dir: Path, summary: Summary, timeline: Timeline, notes: Sequence[str]) -> Path:
    (run_dir / "summary.json").write_text(json.dumps(asdict(summary) | {"passed": summary.passed}, indent=2) + "\n")
    path = run_dir / "report.html"
    path.write_text(render_html(summary, timeline, notes), encoding="utf-8")
    return path
