"""What happened during the demo, on one clock (seconds since the demo started): the data of view and report."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Sample:
    at: float
    replicas: dict[str, int]  # wanted (spec) replicas per workload
    ready: dict[str, int]
    held: int | None  # requests the proxy holds (None: its admin port did not answer)


@dataclass(frozen=True)
class RequestResult:
    sent_at: float
    seconds: float
    ok: bool
    cold: bool  # sent while the app had no ready replica: its wait is a cold-start wait
    error: str = ""


@dataclass(frozen=True)
class BrowserVisit:
    """A person opening the app while it is at zero: the waking page at once, then the app once a reload finds it."""

    sent_at: float
    page_seconds: float | None  # until the waking page arrived (None: it never did)
    app_seconds: float | None  # until a reload got the app's own page (None: none did)
    reloads: int
    error: str = ""


@dataclass(frozen=True)
class ScaleEvent:
    at: float
    workload: str
    by: str  # "hpa" or "proxy"
    before: int
    after: int
    why: str


@dataclass
class Timeline:
    started: float = field(default_factory=time.monotonic)
    samples: list[Sample] = field(default_factory=list)
    requests: list[RequestResult] = field(default_factory=list)
    visits: list[BrowserVisit] = field(default_factory=list)
    events: list[ScaleEvent] = field(default_factory=list)
    # Metric values the HPAs read: (at, value or None) per HPA name.
    metric_values: dict[str, list[tuple[float, float | None]]] = field(default_factory=dict)
    phases: list[tuple[float, str]] = field(default_factory=list)

    def now(self) -> float:
        return time.monotonic() - self.started

    def since_start(self, monotonic: float) -> float:
        return monotonic - self.started

    def phase(self, name: str) -> None:
        self.phases.append((self.now(), name))

    @property
    def current_phase(self) -> str:
        return self.phases[-1][1] if self.phases else "starting"

    def replica_path(self, workload: str) -> list[int]:
        """The wanted replica counts in order, repeats dropped (e.g. [0, 1, 4, 0])."""
        path: list[int] = []
        for sample in self.samples:
            count = sample.replicas.get(workload, 0)
            if not path or path[-1] != count:
                path.append(count)
        return path
