"""Which Kubernetes the cluster runs, and whether its HPA can scale to zero (what a user loses if not).

Whether `minReplicas: 0` is accepted is asked of the apiserver itself, by a dry run of an HPA that needs it:
where the HPAScaleToZero feature gate is off (alpha and off before v1.37), validation refuses it with
`spec.minReplicas: Invalid value: 0: must be greater than or equal to 1`. Nothing is created.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from adapter.doctor.findings import Finding
from adapter.kube.client import KubeClient
from adapter.kube.errors import KubeAPIError, KubeError

VERSION_CHECK = "Kubernetes version"
CHECK = "HPA scale to zero"
# The release where HPA scale-to-zero is on by default and the HPA records ScaledToZero.
FULL_MINOR = 37
# Older than this is not supported (docs/getting-started/install.md).
OLDEST_MINOR = 33
_PROBE_NAME = "zeroscale-doctor-scale-to-zero-probe"


async def check(client: KubeClient, namespace: str) -> list[Finding]:
    try:
        _, version = await client.request("GET", "/version")
    except KubeError as err:
        return [Finding("skip", VERSION_CHECK, f"cannot read /version: {err}")]
    shown = str(version.get("gitVersion", "unknown"))
    minor = _minor(version)
    findings = [_version_finding(shown, minor)]
    findings.append(await _probe(client, namespace, shown, minor))
    return findings


def _minor(version: dict[str, Any]) -> int | None:
    """The minor version ("37", or "37+" on some distributions); None when unreadable."""
    text = str(version.get("minor", "")).rstrip("+")
    return int(text) if text.isdigit() else None


def _version_finding(shown: str, minor: int | None) -> Finding:
    if minor is None:
        return Finding("warn", VERSION_CHECK, f"{shown}: the minor version cannot be read")
    if minor < OLDEST_MINOR:
        return Finding(
            "fail",
            VERSION_CHECK,
            f"{shown} is older than v1.{OLDEST_MINOR}, the oldest release Zeroscale supports",
            f"upgrade to v1.{FULL_MINOR} or newer",
        )
    return Finding("ok", VERSION_CHECK, shown)


def _probe_hpa(namespace: str) -> dict[str, Any]:
    metric = {"metric": {"name": "zeroscale-probe"}, "target": {"type": "AverageValue", "averageValue": "1"}}
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": _PROBE_NAME, "namespace": namespace},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": _PROBE_NAME},
            "minReplicas": 0,
            "maxReplicas": 1,
            "metrics": [{"type": "External", "external": metric}],
        },
    }


async def _probe(client: KubeClient, namespace: str, shown: str, minor: int | None) -> Finding:
    path = f"/apis/autoscaling/v2/namespaces/{quote(namespace, safe='')}/horizontalpodautoscalers?dryRun=All"
    try:
        await client.request("POST", path, _probe_hpa(namespace))
    except KubeAPIError as err:
        if err.status == 422 and "minReplicas" in str(err):
            return Finding(
                "warn",
                CHECK,
                f"not available on {shown}: an HPA with minReplicas: 0 is refused (the HPAScaleToZero feature "
                "gate is off). HPAs then keep at least 1 replica: Zeroscale's metrics still scale them, and the "
                "proxy (wake: always) still wakes a workload from 0, but nothing scales one back to 0",
                f"turn on HPAScaleToZero=true on kube-apiserver and kube-controller-manager, or upgrade to "
                f"v1.{FULL_MINOR}, where it is on by default",
            )
        if err.status == 403:
            return Finding(
                "skip", CHECK, f"cannot tell: you may not create HPAs in {namespace} (checked by a dry run): {err}"
            )
        return Finding("warn", CHECK, f"cannot tell: the dry run of an HPA with minReplicas: 0 failed: {err}")
    except KubeError as err:
        return Finding("warn", CHECK, f"cannot tell: {err}")
    if minor is not None and minor < FULL_MINOR:
        return Finding(
            "warn",
            CHECK,
            f"available on {shown} (minReplicas: 0 accepted), but before v1.{FULL_MINOR} the HPA records no "
            "ScaledToZero condition: it cannot tell a workload it scaled to zero from one a person stopped, and "
            "wakes both. Per-direction behavior.*.tolerance needs v1.35, or the HPAConfigurableTolerance gate",
            f"upgrade to v1.{FULL_MINOR} for the ScaledToZero condition; until then give the proxy's routes "
            "wake: always (wake: scale answers 503 for any workload at 0 whose HPA has no ScaledToZero=True)",
        )
    return Finding(
        "ok",
        CHECK,
        "available: minReplicas: 0 is accepted, and the HPA records ScaledToZero (it wakes only what it scaled "
        "to zero itself)",
    )
