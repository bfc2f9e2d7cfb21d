"""The `doctor` subcommand: arguments, one run of the checks, and the report in plain words (or JSON)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import TextIO

from adapter.config.kube import KubeAPIConfig
from adapter.doctor.checks import Doctor, Installation
from adapter.doctor.findings import Finding
from adapter.kube.client import KubeClient
from adapter.kube.errors import KubeConfigError

_MARKS = {"ok": "ok  ", "warn": "WARN", "fail": "FAIL", "skip": "skip"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    default = Installation()
    parser.add_argument(
        "--kubeconfig",
        type=Path,
        default=None,
        help="kubeconfig of a user who may read the installation (default: $KUBECONFIG, then ~/.kube/config)",
    )
    parser.add_argument("--namespace", default=default.namespace, help="the adapter's namespace (default: %(default)s)")
    parser.add_argument("--service", default=default.service, help="the adapter's Service (default: %(default)s)")
    parser.add_argument(
        "--service-account", default=default.service_account, help="the adapter's ServiceAccount (default: %(default)s)"
    )
    parser.add_argument(
        "--deployment",
        default=default.deployment,
        help="the adapter's Deployment, whose mounted config is read for the gRPC check (default: %(default)s)",
    )
    parser.add_argument(
        "--proxy-deployment",
        default=default.proxy_deployment,
        help="the proxy's Deployment, whose mounted config names the activator Lease and says whether route objects "
        "are served (default: %(default)s)",
    )
    parser.add_argument(
        "--serving-secret",
        default=default.serving_secret,
        help="the serving certificate (default: %(default)s)",
    )
    parser.add_argument(
        "--hpa-namespace", default=default.hpa_namespace, help="namespace of the HPAs to check (default: %(default)s)"
    )
    parser.add_argument("--json", action="store_true", help="print the findings as JSON")


def _kubeconfig(given: Path | None) -> Path:
    if given is not None:
        return given
    from_env = os.environ.get("KUBECONFIG", "").split(os.pathsep)[0]
    return Path(from_env) if from_env else Path.home() / ".kube" / "config"


def report(findings: list[Finding], out: TextIO) -> None:
    for finding in findings:
        out.write(f"[{_MARKS[finding.level]}] {finding.check}: {finding.message}\n")
        if finding.hint and finding.level in ("fail", "warn"):
            out.write(f"       -> {finding.hint}\n")
    failures = sum(1 for f in findings if f.level == "fail")
    out.write(f"\n{failures} problem(s) found\n" if failures else "\nno problems found\n")


async def diagnose(config: KubeAPIConfig, where: Installation) -> list[Finding]:
    client = KubeClient.from_config(config)
    try:
        return await Doctor(client, where).run()
    finally:
        await client.close()


def run(args: argparse.Namespace) -> int:
    where = Installation(
        service=args.service,
        namespace=args.namespace,
        service_account=args.service_account,
        deployment=args.deployment,
        proxy_deployment=args.proxy_deployment,
        serving_secret=args.serving_secret,
        hpa_namespace=args.hpa_namespace,
    )
    try:
        findings = asyncio.run(diagnose(KubeAPIConfig(kubeconfig=_kubeconfig(args.kubeconfig)), where))
    except KubeConfigError as err:
        print(f"doctor: {err}", file=sys.stderr)
        return 2
    if args.json:
        json.dump([finding.as_dict() for finding in findings], sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        report(findings, sys.stdout)
    return 1 if any(finding.level == "fail" for finding in findings) else 0
