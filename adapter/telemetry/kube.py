"""Metrics of the Kubernetes watches both processes keep (EndpointSlices, the activator's reads and writes)."""

from __future__ import annotations

from prometheus_client import Counter

WATCH_CRASHES = Counter(
    "zeroscale_kube_watch_crashes_total",
    "Watch loops that stopped on an unexpected error (a malformed object, a bug) and were started again",
    ["watch"],
)

WATCH_SILENCES = Counter(
    "zeroscale_kube_watch_silences_total",
    "Watches that sent nothing (no event, no bookmark) for kubernetes.watch_silence_timeout, taken for dead and "
    "listed again, by resource",
    ["resource"],
)
