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
            "Scale patches the proxy made, by result (patched: woken; already_awake; conflict: the Scale changed "
            "meanwhile, retried; refused: see the wake decisions; error: the API failed the patch, RBAC on "
            "deployments/scale), and cold starts completed",
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
        *_wake_decisions(y=42),
    ]
    return _dashboard(
        "Zeroscale: scale from zero",
        "zeroscale-scale-from-zero",
        "Cold starts as the buffering proxy saw them: hold times, phases, errors, replicas and time at zero",
        panels,
        _templating("route"),
    )


def _wake_decisions(y: int) -> list[Panel]:
    """What `wake: scale` routes decided from their targets' HPAs (docs/architecture.md#wake)."""
    return [
        RowPanel(title="Wake decisions (what the HPAs intend)", gridPos=GridPos(h=1, w=24, x=0, y=y)),
        _series(
            "Woken, or refused and why",
            "Wakes of `wake: scale` routes sent (woken) or not sent, their held requests answered 503 saying why. "
            "stopped_by_hand: the target's HPA did not scale it to 0 (ScaledToZero not True), a person did; it stays "
            "at 0 until someone scales it (kubectl scale --replicas=1): expected after a deliberate stop, else "
            "set the route's wake: always. no_hpa: no HPA scales the target and the route's wake_without_hpa is false. "
            "ambiguous_hpas: two HPAs scale one target: delete one. hpas_unreadable: the proxy may not list "
            "horizontalpodautoscalers in that namespace (its RBAC)",
            _targets(
                (
                    _rate("increase", "zeroscale_proxy_wakes_total", "route", f'{ROUTE}, result="patched"'),
                    "woken {{route}}",
                ),
                (
                    _rate("increase", "zeroscale_proxy_wake_refusals_total", "route, reason", ROUTE),
                    "refused {{reason}} {{route}}",
                ),
            ),
            GridPos(h=8, w=12, x=0, y=y + 1),
            drawStyle="bars",
        ),
        _series(
            "HPA lists before wakes",
            "Each wake first lists the namespace's HorizontalPodAutoscalers (one list shared by the routes waking "
            "together), so that a workload a person stopped is not woken: lists sent, and the HPAs the latest list "
            "returned (pages of 500). Many HPAs make every wake cost the API server that many objects; lists failing "
            "show as hpas_unreadable refusals or held requests timing out (limits.hold_timeout)",
            _targets(
                (_rate("increase", "zeroscale_proxy_hpa_lists_total", "namespace", ""), "lists {{namespace}}"),
                ("max by (namespace) (zeroscale_proxy_hpas_listed)", "HPAs listed {{namespace}}"),
            ),
            GridPos(h=8, w=12, x=12, y=y + 1),
        ),
    ]


def proxy_operations() -> Dashboard:
    """The proxy's moving parts beyond holding: the activator's Lease and slices, the limits it enforces, tunnels."""
    at = 0
    panels: list[Panel] = [
        RowPanel(title="Activator (routes in mode: activator)", gridPos=GridPos(h=1, w=24, x=0, y=at)),
        _series(
            "Activator Lease: leader and holder",
            "leader: 1 while the replica holds the activator Lease and writes the activator routes' EndpointSlices; "
            "exactly one replica should be at 1. holder writes: 0 while the Lease's holder does not write the route "
            "(nobody holds it, another installation shares the Lease, a replica of another config). Neither at 1 for "
            "longer than activator.lease_duration: the Services follow nothing (alert ZeroscaleActivatorWriterLost): "
            "check the Lease (kubectl get lease -n <activator.lease_namespace>), the proxies' log (RBAC on leases, the "
            "API server), activator.lease_name",
            _targets(
                ("max by (instance) (zeroscale_proxy_activator_leader)", "leader {{instance}}"),
                (
                    f"min by (route) (zeroscale_proxy_activator_holder_serves{{{ROUTE}}})",
                    "holder writes {{route}}",
                ),
            ),
            GridPos(h=8, w=12, x=0, y=at + 1),
            lineInterpolation="stepAfter",
        ),
        _series(
            "Service on the pods (1) or on the proxy (0)",
            "1: the route's Service lists the workload's pods, the proxy out of the path; 0: it lists the proxy's pods "
            "(the workload has no ready pod: requests are held and counted for the HPA). At 0 while the workload has "
            "ready pods: the Service was not switched back; see the switch time and the slice writes",
            _targets((f"max by (route) (zeroscale_proxy_activator_direct{{{ROUTE}}})", "{{route}}")),
            GridPos(h=8, w=12, x=12, y=at + 1),
            lineInterpolation="stepAfter",
            valueMin=0,
            valueMax=1,
        ),
        _series(
            "Switch time p50 / p99",
            "From the event that decided a switch (a pod ready, the target at 0) to the Service's EndpointSlices "
            "written, by where they now send new connections: time during which clients still reach the old "
            "endpoints. Slow: the API server's writes (its latency), or the writer lost the Lease (the slice "
            "writes)",
            _targets(
                *_percentiles(
                    "zeroscale_proxy_activator_switch_seconds", "route to", ROUTE, " {{route}} to {{to}}", 0.5, 0.99
                )
            ),
            GridPos(h=8, w=12, x=0, y=at + 9),
            unit="s",
        ),
        _series(
            "EndpointSlice writes by result",
            "The Lease holder's writes of the activator routes' EndpointSlices. error: the API failed or refused the "
            "write (RBAC on discovery.k8s.io endpointslices, admission webhooks); refused: the Service has a selector "
            "or is missing (the log says which; remove the selector, Zeroscale writes its slices); conflict: a slice "
            "changed under the writer or its name is another owner's (now and then is normal: retried). Alert "
            "ZeroscaleActivatorSliceWritesFailing",
            _targets(
                (
                    _rate("increase", "zeroscale_proxy_activator_slice_writes_total", "route, result", ROUTE),
                    "{{result}} {{route}}",
                )
            ),
            GridPos(h=8, w=12, x=12, y=at + 9),
            drawStyle="bars",
        ),
    ]
    at = 17
    panels += [
        RowPanel(title="Limits and refusals", gridPos=GridPos(h=1, w=24, x=0, y=at)),
        _series(
            "Limits reached, by config key",
            "Requests answered or connections closed because a limit or timeout ran out; the legend names the key to "
            "change: a route's limits.<key> (max_held_requests: its 503s, alert ZeroscaleRouteAtHoldLimit; "
            "body_timeout, max_response_head_bytes, max_tunnels, tunnel_idle_timeout) or proxy.<key> (header_timeout, "
            "max_header_bytes, send_timeout, max_pipelined_bytes, admin_max_connections, http2.*; no route). Raise "
            "one only for legitimate clients: a stream of header_timeout is often a scanner or a slow client",
            _targets((_rate("rate", "zeroscale_proxy_limit_hits_total", "route, limit", ROUTE), "{{limit}} {{route}}")),
            GridPos(h=8, w=12, x=0, y=at + 1),
            unit="ops",
        ),
        _series(
            "Refused messages (400 / 502)",
            "Requests (request: answered 400) and upstream responses (response: answered 502) refused for how they "
            "are framed or routed, by reason (e.g. both Content-Length and Transfer-Encoding, bytes after a "
            "response). request: a client, or a load balancer in front, sends malformed HTTP; response: the upstream "
            "app answers malformed HTTP: fix the app. Neither is a limit to raise",
            _targets(
                (_rate("rate", "zeroscale_proxy_refused_messages_total", "side, reason", ""), "{{side}} {{reason}}")
            ),
            GridPos(h=8, w=12, x=12, y=at + 1),
            unit="ops",
        ),
        _series(
            "Client connections and refusals",
            "Open client connections, and connections closed at once because proxy.max_connections were open (the "
            "client sees a reset). Refusals: raise proxy.max_connections (and the pod's file limit) or add proxy "
            "replicas; held requests piling up also hold connections (the scale from zero dashboard)",
            _targets(
                ("sum by (instance) (zeroscale_proxy_client_connections)", "open {{instance}}"),
                (_rate("rate", "zeroscale_proxy_refused_connections_total", "instance", ""), "refused/s {{instance}}"),
            ),
            GridPos(h=8, w=24, x=0, y=at + 9),
        ),
    ]
    at = 34
    panels += [
        RowPanel(title="Tunnels (upgraded connections)", gridPos=GridPos(h=1, w=24, x=0, y=at)),
        _series(
            "Open tunnels",
            "Upgraded connections (WebSocket and other 101 upgrades) open through each route: each holds a client and "
            "an upstream connection for its life, and leaves the in-flight count at its 101. Capped per route by "
            "limits.max_tunnels; closed after limits.tunnel_idle_timeout without a byte either way",
            _targets((f"sum by (route) (zeroscale_proxy_open_tunnels{{{ROUTE}}})", "{{route}}")),
            GridPos(h=8, w=12, x=0, y=at + 1),
        ),
        _series(
            "Tunnels refused or closed idle",
            "max_tunnels: upgrades answered 503 because the route had limits.max_tunnels open (raise it if the clients "
            "are legitimate); tunnel_idle_timeout: tunnels closed after limits.tunnel_idle_timeout without a byte "
            "(raise it, or have the clients send pings more often than that)",
            _targets(
                (
                    _rate(
                        "increase",
                        "zeroscale_proxy_limit_hits_total",
                        "route, limit",
                        f'{ROUTE}, limit=~"max_tunnels|tunnel_idle_timeout"',
                    ),
                    "{{limit}} {{route}}",
                )
            ),
            GridPos(h=8, w=12, x=12, y=at + 1),
            drawStyle="bars",
        ),
    ]
    return _dashboard(
        "Zeroscale: activator, limits and tunnels",
        "zeroscale-proxy-operations",
        "The proxy beyond holding: who writes the activator routes' Services and how fast they switch, the limits "
        "and refusals it enforces, and the tunnels it carries",
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
            "p95 age of the values served, and time since each metric's last good refresh. Past cache.max_staleness "
            "reads are answered 503 and the HPA stops scaling on the metric (alert ZeroscaleAdapterAnswering503): "
            "see the source errors",
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
            "Time one source query took, successful or not, by source type: the values the HPA reads are at least "
            "this old; near the source's deadline (sources[redis].timeout, sources[kafka].request_timeout) queries "
            "fail (the source errors panel). Check the source itself (its load, the network), then cache.interval",
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
        *_adapter_limits(y=32),
        *_delegate(y=49),
    ]
    return _dashboard(
        "Zeroscale: adapter",
        "zeroscale-adapter",
        "The external metrics adapter: queue depth served against target, freshness, source errors, latency",
        panels,
        _templating("metric", "target"),
    )


def _adapter_limits(y: int) -> list[Panel]:
    return [
        RowPanel(title="Limits, refusals and certificates", gridPos=GridPos(h=1, w=24, x=0, y=y)),
        _series(
            "API connections refused and timeouts",
            "Connections the API (api) and metrics (metrics) listeners closed: refused at once at "
            "server.max_connections or server.max_connections_per_source (metrics: server.metrics_max_connections, "
            "server.metrics_max_connections_per_source), or because a phase overran its deadline: handshake and head "
            "(server.header_timeout), body (server.body_timeout), response (server.response_timeout), idle "
            "(server.idle_timeout: normal for keep-alive). Refusals on api starve the aggregator, the HPAs' reads: "
            "raise the limit, or find the peer taking the connections (the log names its address)",
            _targets(
                (_rate("rate", "zeroscale_api_connections_refused_total", "listener", ""), "refused {{listener}}"),
                (
                    _rate("rate", "zeroscale_api_timeouts_total", "listener, phase", ""),
                    "timeout {{listener}} {{phase}}",
                ),
            ),
            GridPos(h=8, w=12, x=0, y=y + 1),
            unit="ops",
        ),
        _series(
            "gRPC connections against max_connections",
            "Connections open on each gRPC listener (scaler: KEDA; counts: the proxies' count streams) against its "
            "grpc.<server>.max_connections: at the cap, gRPC closes new connections at accept and KEDA's reads fail. "
            "Raise grpc.<server>.max_connections, or find who holds the connections",
            _targets(
                ("max by (server) (zeroscale_grpc_connections)", "open {{server}}"),
                ("max by (server) (zeroscale_grpc_connection_limit)", "max_connections {{server}}"),
            ),
            GridPos(h=8, w=12, x=12, y=y + 1),
        ),
        _series(
            "Serving certificates: time left",
            "Time until each serving certificate in use expires, by the config key naming its files (server.tls, "
            "grpc.scaler.tls, grpc.counts.tls; a self-signed one is made anew at each start). Alerts at 14 and 2 "
            "days (ZeroscaleCertificateExpiresSoon, ZeroscaleCertificateExpiresImminently). Renew the files; the "
            "process reloads them (server.tls.reload_interval, grpc.<server>.tls.reload_interval)",
            _targets(("min by (tls) (zeroscale_certificate_expiry_timestamp_seconds) - time()", "{{tls}}")),
            GridPos(h=8, w=24, x=0, y=y + 9),
            unit="s",
        ),
    ]


def _delegate(y: int) -> list[Panel]:
    return [
        RowPanel(title="Delegate (metrics Zeroscale forwards)", gridPos=GridPos(h=1, w=24, x=0, y=y)),
        _series(
            "Delegate calls by outcome",
            "List calls for metrics Zeroscale does not serve, forwarded to the delegate (delegate.url or "
            "delegate.service), by outcome. 4xx/5xx: the delegate's own answer (its log); unavailable: no answer "
            "within delegate.timeout (the delegate down, a NetworkPolicy, delegate.ca_file not its CA); too-large: "
            "raise delegate.max_response_bytes; malformed: the delegate is no external metrics API. saturated: "
            "answered 429, delegate.max_in_flight calls busy (raise it; one caller may take a quarter)",
            _targets(
                (_rate("rate", "zeroscale_delegate_requests_total", "outcome", ""), "{{outcome}}"),
                (f"sum (rate(zeroscale_delegate_saturated_total[{RATE}]))", "saturated"),
            ),
            GridPos(h=8, w=12, x=0, y=y + 1),
            unit="ops",
        ),
        _series(
            "Delegate discovery",
            "Fetches of the delegate's discovery document (every delegate.discovery_refresh, sooner after a failure) "
            "by outcome, and the metric names it listed, those Zeroscale serves itself left out. error: the delegate "
            "cannot be reached or refused (see the calls); empty: it lists nothing, so no call is forwarded; names "
            "dropping: ScaledObjects removed on the delegate's side, or names now served by Zeroscale",
            _targets(
                (_rate("increase", "zeroscale_delegate_discoveries_total", "outcome", ""), "fetches {{outcome}}"),
                ("max (zeroscale_delegate_metrics)", "metrics listed"),
            ),
            GridPos(h=8, w=12, x=12, y=y + 1),
        ),
    ]


DASHBOARDS = {
    "zeroscale-scale-from-zero.json": scale_from_zero,
    "zeroscale-adapter.json": adapter,
    "zeroscale-proxy-operations.json": proxy_operations,
}


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
