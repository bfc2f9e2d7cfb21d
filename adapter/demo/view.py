"""The live terminal view (rich): replicas, what each HPA read and decided, held requests, request counts.

On a terminal it redraws in place; otherwise (CI, a pipe) each phase and scale event is one printed line.
"""

from __future__ import annotations

from collections.abc import Mapping

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from adapter.demo.autoscaler import LocalHPA
from adapter.demo.timeline import ScaleEvent, Timeline

_RECENT_EVENTS = 6


def _value(hpa: LocalHPA) -> str:
    last = hpa.last
    if last is None:
        return "-"
    return "unreadable" if last.value is None else f"{last.value:g}"


def render(timeline: Timeline, hpas: Mapping[str, LocalHPA]) -> Group:
    table = Table(title=f"zeroscale demo  t={timeline.now():5.1f}s  phase: {timeline.current_phase}", expand=True)
    for column in ("workload", "replicas", "ready", "metric (HPA read)", "target/replica", "HPA"):
        table.add_column(column)
    for name, hpa in hpas.items():
        metric = hpa.spec.metrics[0]
        target = getattr(metric, "target", None)
        why = hpa.last.decision.why if hpa.last else "waiting for the first sync"
        table.add_row(
            name,
            str(hpa.workload.spec_replicas),
            str(hpa.workload.ready_replicas),
            f"{getattr(metric, 'name', '?')} = {_value(hpa)}",
            target.text if target is not None else "-",
            why,
        )
    sample = timeline.samples[-1] if timeline.samples else None
    held = "-" if sample is None or sample.held is None else str(sample.held)
    requests = timeline.requests
    lost = sum(1 for r in requests if not r.ok)
    status = Text(f"held by the proxy: {held}   requests: {len(requests)} sent, {lost} lost")
    events = [Text(describe(event), style="dim") for event in timeline.events[-_RECENT_EVENTS:]]
    return Group(table, status, *events)


def describe(event: ScaleEvent) -> str:
    return f"{event.at:6.1f}s  {event.workload}: {event.before} -> {event.after} by {event.by}: {event.why}"


class View:
    """`live()` while the scenario runs; `line()` for what must stay on screen either way."""

    def __init__(self, timeline: Timeline, hpas: Mapping[str, LocalHPA], console: Console | None = None) -> None:
        self.console = console or Console()
        self._timeline = timeline
        self._hpas = hpas
        self._live: Live | None = None
        self._printed_events = 0
        self._printed_phases = 0

    @property
    def interactive(self) -> bool:
        return self.console.is_terminal

    def start(self) -> None:
        if self.interactive:
            self._live = Live(
                get_renderable=lambda: render(self._timeline, self._hpas),
                console=self.console,
                refresh_per_second=4,
                transient=False,
            )
            self._live.start()

    def tick(self) -> None:
        """Without a terminal: print the phases and events that are new since the last tick."""
        if self.interactive:
            return
        timeline = self._timeline
        lines = [(at, f"{at:6.1f}s  == {phase}") for at, phase in timeline.phases[self._printed_phases :]]
        lines += [(event.at, describe(event)) for event in timeline.events[self._printed_events :]]
        self._printed_phases, self._printed_events = len(timeline.phases), len(timeline.events)
        for _, text in sorted(lines, key=lambda line: line[0]):
            self.line(text)

    def stop(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None
        self.tick()

    def line(self, text: str) -> None:
        self.console.print(text, highlight=False, markup=False, soft_wrap=True)
