"""`zeroscale explain`: what would the HPA do with this manifest right now, and why?

Reads HPA manifests, reads each External metric from a running adapter (`--adapter-url`)
or through a cluster (`--kubeconfig`), or takes `--set name=value`, and runs one sync of
`HorizontalController`, as the HPA's first sync after a (re)start: the history holds only
the current count (a scale-down waits out the down window) and no scale events.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import ssl
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from adapter.argtypes import whole_number
from adapter.config.kube import KubeAPIConfig
from adapter.hpa.controller import (
    DEFAULT_DOWNSCALE_STABILIZATION,
    DEFAULT_TOLERANCE,
    HorizontalController,
    MetricReading,
)
from adapter.hpa.decision import Decision
from adapter.hpa.fetch import adapter_client, read_external_metric, read_pods, read_scale, read_scaled_to_zero
from adapter.hpa.manifest import HPAManifest, ManifestError, load_manifests, parse_manifests
from adapter.hpa.render import decision_json, print_decision
from adapter.hpa.replicas import Pods
from adapter.hpa.spec import ExternalMetric, ObjectMetric
from adapter.k8s_wire.quantity import QuantityError, quantity_milli
from adapter.kube.client import KubeClient
from adapter.kube.errors import KubeError


class UsageError(Exception):
    """Something the user must give or fix; printed without a traceback, exit code 2."""


_count = whole_number("a replica count")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-f",
        "--filename",
        action="append",
        required=True,
        metavar="FILE",
        help="HPA manifest, YAML or JSON, several documents allowed; '-' reads stdin (repeatable)",
    )
    parser.add_argument("-n", "--namespace", default="default", help="namespace of manifests that name none")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="METRIC=VALUE",
        dest="sets",
        help="what-if: use this Quantity for every metric of that name (repeatable)",
    )
    parser.add_argument(
        "--replicas", type=_count, help="current replicas (default: the scale subresource via --kubeconfig)"
    )
    parser.add_argument("--ready-pods", type=_count, help="ready pods for Value targets (default: --replicas)")
    parser.add_argument(
        "--scaled-to-zero",
        action="store_true",
        help="assume ScaledToZero=True (the HPA itself scaled the workload to 0) when the manifest has no status",
    )
    parser.add_argument("--adapter-url", help="read External metrics from this adapter, e.g. https://127.0.0.1:6443")
    parser.add_argument(
        "--insecure-skip-tls-verify", action="store_true", help="do not verify the adapter's certificate"
    )
    parser.add_argument("--ca-file", type=Path, help="CA bundle for the adapter's certificate")
    parser.add_argument("--token-file", type=Path, help="bearer token for the adapter, read from this file")
    parser.add_argument("--client-cert", type=Path, help="client certificate for the adapter")
    parser.add_argument("--client-key", type=Path, help="client key for the adapter")
    parser.add_argument(
        "--kubeconfig",
        type=Path,
        help="read metrics (unless --adapter-url), scale, pods and HPA status through this cluster",
    )
    parser.add_argument(
        "--tolerance",
        type=float,
        default=DEFAULT_TOLERANCE,
        help="the controller's --horizontal-pod-autoscaler-tolerance",
    )
    parser.add_argument(
        "--downscale-stabilization",
        type=int,
        default=DEFAULT_DOWNSCALE_STABILIZATION,
        metavar="SECONDS",
        help="the controller's --horizontal-pod-autoscaler-downscale-stabilization",
    )
    parser.add_argument("-o", "--output", choices=["table", "json"], default="table")


ONE_SHOT_NOTE = (
    "one sync, as the HPA's first after a (re)start: its history holds only the current count, so the "
    "scale-down window holds any scale-down, and rate limits see no earlier scale events"
)


@dataclass(frozen=True)
class Explained:
    manifest: HPAManifest
    decision: Decision

    @property
    def notes(self) -> list[str]:
        notes = [ONE_SHOT_NOTE]
        disabled = any(c.reason == "ScalingDisabled" for c in self.decision.conditions)
        if disabled and self.manifest.spec.min_replicas == 0:
            notes.append("if the HPA itself scaled this workload to zero, rerun with --scaled-to-zero")
        return notes


def _what_if(sets: list[str]) -> dict[str, int]:
    values = {}
    for item in sets:
        name, sep, text = item.partition("=")
        if not sep or not name:
            raise UsageError(f"--set {item!r}: use METRIC=VALUE, e.g. --set s0-redis-jobs=120")
        try:
            values[name.lower()] = quantity_milli(text)
        except QuantityError as err:
            raise UsageError(f"--set {item!r}: {err}") from None
    return values


def _read_manifests(files: list[str], namespace: str) -> list[HPAManifest]:
    manifests: list[HPAManifest] = []
    for file in files:
        if file == "-":
            manifests += parse_manifests(sys.stdin.read(), "<stdin>", namespace)
        else:
            manifests += load_manifests(Path(file), namespace)
    return manifests


def _adapter_client(args: argparse.Namespace) -> KubeClient | None:
    if not args.adapter_url:
        return None
    return adapter_client(
        args.adapter_url,
        ca_file=args.ca_file,
        token_file=args.token_file,
        client_cert=args.client_cert,
        client_key=args.client_key,
        insecure=args.insecure_skip_tls_verify,
    )


class _Explainer:
    def __init__(self, args: argparse.Namespace, what_if: dict[str, int]) -> None:
        self.args = args
        self.what_if = what_if
        self.adapter = _adapter_client(args)
        self.cluster = KubeClient.from_config(KubeAPIConfig(kubeconfig=args.kubeconfig)) if args.kubeconfig else None

    async def close(self) -> None:
        for client in (self.adapter, self.cluster):
            if client is not None:
                await client.close()

    async def readings(self, manifest: HPAManifest) -> list[MetricReading]:
        spec = manifest.spec
        metrics_client = self.adapter or self.cluster
        readings: list[MetricReading] = []
        for metric in spec.metrics:
            if metric.name.lower() in self.what_if:
                readings.append(self.what_if[metric.name.lower()])
            elif isinstance(metric, ExternalMetric) and metrics_client is not None:
                readings.append(await read_external_metric(metrics_client, spec.namespace, metric))
            elif isinstance(metric, ExternalMetric | ObjectMetric):
                how = "--set, --adapter-url or --kubeconfig" if isinstance(metric, ExternalMetric) else "--set"
                raise UsageError(f"{spec.key}: no value for {metric.display}: give {how} (--set {metric.name}=VALUE)")
            else:
                readings.append(0)  # unsupported types fail inside the controller, as unreadable metrics
        return readings

    async def replicas(self, manifest: HPAManifest) -> tuple[int, int, Pods, bool | None]:
        """(spec replicas, status replicas, pods, ScaledToZero) from options, else from the cluster."""
        args, spec = self.args, manifest.spec
        scaled_to_zero = manifest.scaled_to_zero
        if args.replicas is not None:
            ready = args.replicas if args.ready_pods is None else args.ready_pods
            return args.replicas, args.replicas, Pods(max(args.replicas, ready), ready), scaled_to_zero
        if self.cluster is None:
            raise UsageError(f"{spec.key}: give --replicas N, or --kubeconfig to read the scale subresource")
        scale = await read_scale(self.cluster, spec.namespace, spec.scale_target)
        if args.ready_pods is not None:
            pods = Pods(max(scale.status_replicas, args.ready_pods), args.ready_pods)
        else:
            pods = await read_pods(self.cluster, spec.namespace, scale.selector)
        if scaled_to_zero is None:
            scaled_to_zero = await read_scaled_to_zero(self.cluster, spec.namespace, spec.name)
        return scale.spec_replicas, scale.status_replicas, pods, scaled_to_zero

    async def explain(self, manifest: HPAManifest) -> Decision:
        current, status, pods, scaled_to_zero = await self.replicas(manifest)
        readings = await self.readings(manifest)
        if scaled_to_zero is None and self.args.scaled_to_zero and manifest.spec.min_replicas == 0:
            scaled_to_zero = True
        controller = HorizontalController(
            manifest.spec,
            tolerance=self.args.tolerance,
            downscale_stabilization=self.args.downscale_stabilization,
            scaled_to_zero=scaled_to_zero,
        )
        return controller.sync(0.0, current, status, pods.ready, readings, listed_pods=pods.listed)


async def _explain_all(args: argparse.Namespace, manifests: list[HPAManifest]) -> list[Explained]:
    explainer = _Explainer(args, _what_if(args.sets))
    try:
        return [Explained(m, await explainer.explain(m)) for m in manifests]
    finally:
        await explainer.close()


def run(args: argparse.Namespace) -> int:
    """The subcommand: 0 when every HPA was explained (even as unable to scale), 2 on a usage error."""
    try:
        manifests = _read_manifests(args.filename, args.namespace)
        explained = asyncio.run(_explain_all(args, manifests))
    except (UsageError, ManifestError) as err:
        print(f"explain: {err}", file=sys.stderr)
        return 2
    except (OSError, ssl.SSLError) as err:  # ssl's errors do not name the file
        print(f"explain: cannot use --ca-file/--client-cert/--client-key: {err}", file=sys.stderr)
        return 2
    except KubeError as err:
        print(f"explain: {err}", file=sys.stderr)
        return 1
    if args.output == "json":
        document: list[dict[str, Any]] = [decision_json(e.manifest.spec, e.decision, e.notes) for e in explained]
        print(json.dumps(document, indent=2))
    else:
        console = Console()
        for e in explained:
            print_decision(console, e.manifest.spec, e.decision, e.notes)
    return 0
