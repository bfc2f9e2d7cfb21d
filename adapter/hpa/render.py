"""Decisions for people (rich tables) and for programs (JSON)."""

from __future__ import annotations

import math
from typing import Any

from rich.console import Console, Group
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table

from adapter.hpa.decision import Decision, limit_lines, stabilization_line
from adapter.hpa.spec import HPASpec


def _number(value: float | None) -> float | str | None:
    """JSON has no Inf/NaN: write them as Go prints them."""
    if value is None or math.isfinite(value):
        return value
    return "NaN" if math.isnan(value) else ("+Inf" if value > 0 else "-Inf")


def decision_json(spec: HPASpec, decision: Decision, notes: list[str]) -> dict[str, Any]:
    stabilization = decision.stabilization
    limits = decision.limits
    return {
        "hpa": decision.hpa,
        "scaleTargetRef": f"{spec.scale_target.kind}/{spec.scale_target.name}",
        "minReplicas": spec.min_replicas,
        "maxReplicas": spec.max_replicas,
        "currentReplicas": decision.current_replicas,
        "desiredReplicas": decision.desired_replicas,
        "rescale": decision.rescale,
        "metrics": [
            {
                "metric": m.label,
                "type": m.kind,
                "targetType": m.target_type,
                "target": m.target,
                "value": m.value,
                "current": m.current,
                "ratio": _number(m.ratio),
                "toleranceBand": None if m.tolerance_band is None else list(m.tolerance_band),
                "withinTolerance": m.within_tolerance,
                "proposal": m.proposal,
                "how": m.how or None,
                "error": m.error,
            }
            for m in decision.metrics
        ],
        "recommendation": decision.proposal,
        "stabilization": None
        if stabilization is None
        else {
            "upWindowSeconds": stabilization.up_window,
            "downWindowSeconds": stabilization.down_window,
            "upFloor": stabilization.up_floor,
            "downCeiling": stabilization.down_ceiling,
            "result": stabilization.result,
            "reason": stabilization.reason,
        },
        "limits": None
        if limits is None
        else {
            "direction": limits.direction,
            "selectPolicy": None if limits.select_policy is None else str(limits.select_policy),
            "policies": [
                {"policy": str(p.policy), "periodStartReplicas": p.period_start, "allowed": p.allowed}
                for p in limits.policies
            ],
            "rateLimit": limits.rate_limit,
            "result": limits.result,
            "reason": limits.reason,
            "message": limits.message,
        },
        "conditions": [
            {"type": c.type, "status": c.status_text, "reason": c.reason, "message": c.message}
            for c in decision.conditions
        ],
        "events": [{"type": e.type, "reason": e.reason, "message": e.message} for e in decision.events],
        "why": decision.why,
        "explanation": decision.explanation(),
        "notes": notes,
    }


def _metrics_table(decision: Decision) -> Table:
    table = Table(title="metrics", title_justify="left", expand=False)
    for column in ("metric", "value", "target", "ratio", "tolerance band", "proposal"):
        table.add_column(column)
    for m in decision.metrics:
        if m.error is not None:
            table.add_row(
                escape(m.label), "[red]error[/red]", escape(m.target or ""), "", "", f"[red]{escape(m.error)}[/red]"
            )
            continue
        band = ""
        if m.tolerance_band is not None:
            low, high = m.tolerance_band
            band = f"[{low:.4g}, {high:.4g}] " + ("inside" if m.within_tolerance else "outside")
        ratio = "" if m.ratio is None else str(_number(round(m.ratio, 4) if math.isfinite(m.ratio) else m.ratio))
        cells = (m.label, m.value or "", f"{m.target} ({m.target_type})", ratio, band, f"{m.proposal}: {m.how}")
        table.add_row(*map(escape, cells))
    return table


def _steps_table(decision: Decision, notes: list[str]) -> Table:
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column("step", style="bold")
    table.add_column("detail")
    if decision.proposal is not None:
        table.add_row("raw recommendation", str(decision.proposal))
    if decision.stabilization is not None:
        table.add_row(
            "stabilization", escape(stabilization_line(decision.stabilization).removeprefix("stabilization: "))
        )
    if decision.limits is not None:
        table.add_row("limits", escape("\n".join(limit_lines(decision.limits))))
    table.add_row("final", f"{decision.desired_replicas} (current {decision.current_replicas})")
    table.add_row("why", escape(decision.why))
    for note in notes:
        table.add_row("note", escape(note))
    return table


def _conditions_table(decision: Decision) -> Table:
    table = Table(title="conditions", title_justify="left")
    for column in ("type", "status", "reason", "message"):
        table.add_column(column)
    for c in decision.conditions:
        table.add_row(c.type, c.status_text, c.reason, escape(c.message))
    return table


def print_decision(console: Console, spec: HPASpec, decision: Decision, notes: list[str]) -> None:
    target = f"{spec.scale_target.kind}/{spec.scale_target.name}"
    title = (
        f"{decision.hpa} -> {target}: {decision.current_replicas} -> {decision.desired_replicas} replicas "
        f"(min {spec.min_replicas}, max {spec.max_replicas})"
    )
    parts = [_steps_table(decision, notes), _conditions_table(decision)]
    if decision.metrics:
        parts.insert(0, _metrics_table(decision))
    body = Group(*parts)
    console.print(Panel(body, title=escape(title), title_align="left"))
