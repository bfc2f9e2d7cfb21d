"""The Zeroscale dashboards, as code. `python grafana/generate.py` writes grafana/dashboards/*.json;
`--check` exits 1 when the committed JSON differs from what this file generates.

Every panel reads only series Zeroscale exports itself (adapter/telemetry/), so no kube-state-metrics is
needed: the proxy reports its targets' replicas, endpoints and time at zero. Template variables:
`datasource` (a Prometheus), `route` (proxy routes), `metric` (adapter metrics) and `target` (the per-replica
target the HPAs use, drawn against queue depth). tests/grafana/ runs every query against a real Prometheus.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from grafanalib._gen import DashboardEncoder  # type: ignore[import-untyped]
from grafanalib.core import (  # type: ignore[import-untyped]
    Dashboard,
    GridPos,
    Heatmap,
    Panel,
    Repeat,
    RowPanel,
    Stat,
    Target,
    Template,
    Templating,
    Time,
    TimeSeries,
    YAxis,
)

HERE = Path(__file__).resolve().parent
OUT = HERE / "dashboards"
DATASOURCE = "${datasource}"
RATE = "$__rate_interval"
ROUTE = 'route=~"$route"'
METRIC = 'metric=~"$metric"'
SCALER = 'server="scaler"'


class _ExemplarTarget(Target):  # type: ignore[misc]
    """A target whose panel also draws its histogram's exemplars: a point per sampled request, which opens the
    request's trace (the Prometheus data source's exemplarTraceIdDestinations, grafana/provisioning). grafanalib's
    Target has no field for it."""

    def to_json_data(self) -> dict[str, object]:
        return {**super().to_json_data(), "exemplar": True}


def _target(expr: str, legend: str, ref: str, exemplar: bool = False, **extra: object) -> Target:
    kind = _ExemplarTarget if exemplar else Target
    return kind(expr=expr, legendFormat=legend, refId=ref, datasource=DATASOURCE, **extra)


def _targets(*pairs: tuple[str, str], exemplars: bool = False) -> list[Target]:
    """`exemplars`: the panel draws them, asked by its first target only (each asking would draw each point again)."""
    return [
        _target(expr, legend, chr(ord("A") + index), exemplars and index == 0)
        for index, (expr, legend) in enumerate(pairs)
    ]


def _rate(function: str, series: str, by: str, selector: str, window: str = RATE) -> str:
    """`sum by (<by>) (<function>(<series>{<selector>}[<window>]))`."""
    return f"sum by ({by}) ({function}({series}{{{selector}}}[{window}]))"


def _quantile(q: float, histogram: str, by: str, selector: str) -> str:
    return f"histogram_quantile({q}, {_rate('rate', histogram + '_bucket', ', '.join(['le', *by.split()]), selector)})"


def _percentiles(histogram: str, by: str, selector: str, legend: str, *qs: float) -> list[tuple[str, str]]:
    """One (expression, legend) pair per quantile, legends `p50<legend>`, `p99<legend>` and so on."""
    return [(_quantile(q, histogram, by, selector), f"p{round(q * 100)}{legend}") for q in qs]


def _series(
    title: str, description: str, targets: list[Target], pos: GridPos, unit: str = "short", **extra: object
) -> TimeSeries:
    return TimeSeries(
        title=title,
        description=description,
        dataSource=DATASOURCE,
        targets=targets,
        gridPos=pos,
        unit=unit,
        legendDisplayMode="list",
        **extra,
    )


def _templating(*names: str) -> Templating:
    variables = [Template(name="datasource", label="Prometheus", query="prometheus", type="datasource", default="")]
    queries = {
        "route": ("Route", "label_values(zeroscale_proxy_held_requests, route)"),
        "metric": ("Metric", "label_values(zeroscale_series, metric)"),
    }
    for name in names:
        if name == "target":
            variables.append(
                Template(name="target", label="Target per replica", query="100", default="100", type="textbox")
            )
            continue
        label, query = queries[name]
        variables.append(
            Template(
                name=name,
                label=label,
                query=query,
                dataSource=DATASOURCE,
                includeAll=True,
                multi=True,
                allValue=".*",
                default="$__all",
                refresh=2,
                sort=1,
            )
        )
    return Templating(list=variables)


def _dashboard(title: str, uid: str, description: str, panels: list[Panel], templating: Templating) -> Dashboard:
    return Dashboard(
        title=title,
        uid=uid,
        description=description,
        tags=["zeroscale"],
        timezone="browser",
        time=Time("now-3h", "now"),
        refresh="30s",
        templating=templating,
        panels=panels,
    ).auto_panel_ids()


def scale_from_zero() -> Dashboard:
    """What users of scale-to-zero care about: how long requests waited through a cold start, and the saving."""
    hold = "zeroscale_proxy_hold_duration_seconds"
    phases = (
        ("zeroscale_proxy_cold_start_wake_to_ready_seconds", "wake -> ready endpoint {{route}}"),
        ("zeroscale_proxy_cold_start_ready_to_first_byte_seconds", "ready endpoint -> first byte {{route}}"),
    )
    panels: list[Panel] = [
        RowPanel(title="Requests held through cold starts", gridPos=GridPos(h=1, w=24, x=0, y=0)),
        _series(
            "Hold time p50 / p95 / p99",
            "How long requests waited in the proxy before being forwarded or answered",
            _targets(*_percentiles(hold, "", ROUTE, "", 0.5, 0.95, 0.99), exemplars=True),
            GridPos(h=8, w=12, x=0, y=1),
            unit="s",
        ),
        Heatmap(
            title="Cold-start waits",
            description="Distribution of the time requests were held, per interval",
            dataSource=DATASOURCE,
            targets=[
                _target(
                    f"sum by (le) (increase({hold}_bucket{{{ROUTE}}}[{RATE}]))", "{{le}}", "A", True, format="heatmap"
                )
            ],
            gridPos=GridPos(h=8, w=12, x=12, y=1),
            dataFormat="tsbuckets",
            yAxis=YAxis(format="s"),
            hideZeroBuckets=True,
        ),
        _series(
            "Cold-start phases (mean)",
            "Wake sent (or first request held) to the first ready endpoint, then to the first response byte",
            _targets(
                *(
                    (
                        f"sum by (route) (rate({name}_sum{{{ROUTE}}}[{RATE}])) "
                        f"/ sum by (route) (rate({name}_count{{{ROUTE}}}[{RATE}]))",
                        legend,
                    )
                    for name, legend in phases
                )
            ),
            GridPos(h=8, w=12, x=0, y=9),
            unit="s",
            drawStyle="bars",
            stacking={"mode": "normal", "group": "A"},
        ),
        _series(
            "Held and in-flight requests",
            "Requests waiting for a ready endpoint, and requests sent upstream not yet answered",
            _targets(
                (f"sum by (route) (zeroscale_proxy_held_requests{{{ROUTE}}})", "held {{route}}"),
                (f"sum by (route) (zeroscale_proxy_inflight_requests{{{ROUTE}}})", "in flight {{route}}"),
            ),
            GridPos(h=8, w=12, x=12, y=9),
        ),
        _series(
            "Wakes and cold starts",
            "Scale patches the proxy made (by result) and cold starts completed",
            _targets(
                (_rate("increase", "zeroscale_proxy_wakes_total", "route, result", ROUTE), "{{route}} {{result}}"),
                (_rate("increase", "zeroscale_proxy_cold_starts_total", "route", ROUTE), "{{route}} cold starts"),
            ),
            GridPos(h=8, w=12, x=0, y=17),
            drawStyle="bars",
        ),
        _series(
            "Requests answered 503 / 504 / 499",
            "503: over a hold limit; 504: no ready endpoint within hold_timeout; 499: the client left while held",
            _targets(
                *(
                    (
                        _rate("rate", "zeroscale_proxy_error_responses_total", "route", f'{ROUTE}, code="{code}"'),
                        f"{code} {{{{route}}}}",
                    )
                    for code in ("503", "504", "499")
                )
            ),
            GridPos(h=8, w=12, x=12, y=17),
            unit="reqps",
        ),
        _series(
            "Cold-start choices",
            "Requests a route's options answered or sent on instead of holding them (waking_page: a browser's "
            "navigation got the waking page; never_wake: a rule's answer; fallback: sent to the fallback Service; "
            "overflow_*: the full queue's choice) and extra workloads woken (also_wake, also_wake_refused)",
            _targets(
                (
                    _rate("increase", "zeroscale_proxy_cold_choices_total", "route, choice", ROUTE),
                    "{{route}} {{choice}}",
                )
            ),
            GridPos(h=8, w=24, x=0, y=25),
            drawStyle="bars",
        ),
        RowPanel(title="Replicas and the saving", gridPos=GridPos(h=1, w=24, x=0, y=33)),
        _series(
            "Replicas of each target",
            "spec.replicas of each route's scale target and the ready endpoints the proxy sees (no kube-state-metrics)",
            _targets(
                (f"max by (route, name) (zeroscale_proxy_target_replicas{{{ROUTE}}})", "replicas {{name}}"),
                (f"max by (route) (zeroscale_proxy_ready_endpoints{{{ROUTE}}})", "ready endpoints {{route}}"),
            ),
            GridPos(h=8, w=12, x=0, y=34),
            lineInterpolation="stepAfter",
        ),
        _series(
            "Share of time at zero",
            "Fraction of each interval the route's workload had no endpoint at all",
            _targets(
                (f"max by (route) (rate(zeroscale_proxy_target_at_zero_seconds_total{{{ROUTE}}}[{RATE}]))", "{{route}}")
            ),
            GridPos(h=8, w=6, x=12, y=34),
            unit="percentunit",
            valueMin=0,
            valueMax=1,
        ),
        Stat(
            title="Time at zero (the saving)",
            description="Time each route's workload spent at zero replicas in the selected range",
            dataSource=DATASOURCE,
            targets=[
                _target(
                    f"max by (route) (increase(zeroscale_proxy_target_at_zero_seconds_total{{{ROUTE}}}[$__range]))",
                    "{{route}}",
                    "A",
                )
            ],
            gridPos=GridPos(h=8, w=6, x=18, y=34),
            format="s",
            reduceCalc="lastNotNull",
        ),
    ]
    return _dashboard(
        "Zeroscale: scale from zero",
        "zeroscale-scale-from-zero",
        "Cold starts as the buffering proxy saw them: hold times, phases, errors, replicas and time at zero",
        panels,
        _templating("route"),
    )


def adapter() -> Dashboard:
    """The external metrics adapter: what it serves, how fresh, what fails, how fast."""
    panels: list[Panel] = [
        _series(
            "Queue depth against target: $metric",
            "The value served to the HPA (summed over its series) against the per-replica target",
            _targets(
                ('sum by (metric) (zeroscale_metric_value{metric="$metric"})', "queue depth"),
                ("vector($target)", "target per replica"),
            ),
            GridPos(h=8, w=12, x=0, y=0),
            repeat=Repeat(direction="h", variable="metric", maxPerRow=2),
        ),
        _series(
            "Value age",
            "p95 age of the values served, and time since each metric's last good refresh",
            _targets(
                (_quantile(0.95, "zeroscale_metric_value_age_seconds", "metric", METRIC), "p95 age {{metric}}"),
                (
                    f"time() - max by (metric) (zeroscale_metric_last_success_timestamp_seconds{{{METRIC}}})",
                    "since refresh {{metric}}",
                ),
            ),
            GridPos(h=8, w=12, x=0, y=8),
            unit="s",
        ),
        _series(
            "Source errors",
            "Failed source queries, and reads answered 503 because the last good value was too old",
            _targets(
                (_rate("rate", "zeroscale_source_errors_total", "source, metric", METRIC), "{{source}} {{metric}}"),
                (_rate("rate", "zeroscale_stale_reads_total", "metric", METRIC), "stale reads {{metric}}"),
            ),
            GridPos(h=8, w=12, x=12, y=8),
            unit="ops",
        ),
        _series(
            "Source query time p95",
            "Time one source query took",
            _targets((_quantile(0.95, "zeroscale_source_query_duration_seconds", "source", ""), "{{source}}")),
            GridPos(h=8, w=12, x=0, y=16),
            unit="s",
        ),
        _series(
            "External metrics API latency",
            "Complete request to answer written, p50 and p99 by route kind",
            _targets(*_percentiles("zeroscale_api_request_duration_seconds", "route", "", " {{route}}", 0.5, 0.99)),
            GridPos(h=8, w=12, x=12, y=16),
            unit="s",
        ),
        _series(
            "gRPC latency",
            "KEDA external scaler calls, p50 and p99 by method",
            _targets(
                *_percentiles("zeroscale_grpc_request_duration_seconds", "method", SCALER, " {{method}}", 0.5, 0.99)
            ),
            GridPos(h=8, w=12, x=0, y=24),
            unit="s",
        ),
        _series(
            "API and gRPC requests",
            "Requests answered, by route kind or method, and status code",
            _targets(
                (_rate("rate", "zeroscale_api_requests_total", "route, code", ""), "api {{route}} {{code}}"),
                (_rate("rate", "zeroscale_grpc_requests_total", "method, code", ""), "grpc {{method}} {{code}}"),
            ),
            GridPos(h=8, w=12, x=12, y=24),
            unit="reqps",
        ),
    ]
    return _dashboard(
        "Zeroscale: adapter",
        "zeroscale-adapter",
        "The external metrics adapter: queue depth served against target, freshness, source errors, latency",
        panels,
        _templating("metric", "target"),
    )


DASHBOARDS = {"zeroscale-scale-from-zero.json": scale_from_zero, "zeroscale-adapter.json": adapter}


def render(dashboard: Dashboard) -> str:
    return json.dumps(dashboard.to_json_data(), cls=DashboardEncoder, sort_keys=True, indent=2) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="compare with the committed JSON instead of writing")
    args = parser.parse_args(argv)
    stale = []
    for name, build in DASHBOARDS.items():
        path, text = OUT / name, render(build())
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            OUT.mkdir(exist_ok=True)
            path.write_text(text)
    if stale:
        print(f"out of date: {', '.join(stale)}; run python grafana/generate.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
