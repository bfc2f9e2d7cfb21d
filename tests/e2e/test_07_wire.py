"""What the v1.37 aggregator and HPA controller sent the adapter during the whole run, each answered as a v1.37
apiserver answers it; and discovery through the aggregator works for kubectl.

Runs last: it reads the adapter's access log (one DEBUG line per request) of every scenario before it.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from tests.e2e.cluster import Kube
from tests.e2e.fixtures import Adapter, Timeline

GROUP_VERSION = "/apis/external.metrics.k8s.io/v1beta1"
AGGREGATED = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
METRICS = {"redis-jobs", "kafka-lag", "http-pending"}
_LINE = re.compile(r"adapter\.api\.access: (\w+) '([^']*)' accept=(.*) user-agent=(.*) -> (\d{3})$")
_LIST = re.compile(rf"^{GROUP_VERSION}/namespaces/[^/?]+/([^/?]+)(\?.*)?$")
HPA_AGENT = "system:serviceaccount:kube-system:horizontal-pod-autoscaler"


def access_log(log_file: Path) -> list[tuple[str, str, str, str, int]]:
    """(method, target, accept, user agent, status) of every request the adapter answered."""
    lines = []
    for line in log_file.read_text(errors="replace").splitlines():
        found = _LINE.search(line)
        if found:
            method, target, accept, agent, status = found.groups()
            lines.append((method, target, accept.strip("'"), agent.strip("'"), int(status)))
    return lines


def verdict(target: str, accept: str, agent: str, status: int) -> str | None:
    """What a v1.37 apiserver would have answered, when ours differs; None when it is the same."""
    if "as=" in accept:
        # Aggregated discovery (or another conversion) we do not write: 406 makes the aggregator fall back.
        return None if status == 406 else f"{status}, not 406 NotAcceptable"
    if target.startswith("/openapi/"):
        # No OpenAPI document: the aggregator's OpenAPI controller skips a service that answers 404.
        return None if status == 404 else f"{status}, not 404"
    if target in ("/apis", "/apis/external.metrics.k8s.io", GROUP_VERSION):
        return None if status == 200 else f"{status}, not 200"
    listed = _LIST.match(target)
    if listed and HPA_AGENT in agent:
        # A value (200), or a Status saying it cannot be had (503): never a made-up zero, never 404/500.
        if listed.group(1) not in METRICS:
            return f"an unknown metric {listed.group(1)}"
        return None if status in (200, 503) else f"{status}, not 200 or 503"
    if listed:
        return None  # the tests' own calls (401/403/200 cases asserted where they are made)
    return f"a request no scenario expects ({status})"


def test_every_request_of_the_aggregator_and_the_hpa_is_answered_as_v1_37_answers_it(
    adapter: Adapter, kube: Kube, timeline: Timeline
) -> None:
    # kubectl reads the aggregator's merged discovery: our group is there, with every metric as a resource.
    resources = kube.kubectl("api-resources", "--api-group=external.metrics.k8s.io", "-o", "name").stdout.split()
    assert {name.split(".")[0] for name in resources} == METRICS, resources
    merged = kube.request("GET", "/apis", headers={"Accept": AGGREGATED})
    assert merged["kind"] == "APIGroupDiscoveryList"
    (group,) = [item for item in merged["items"] if item["metadata"]["name"] == "external.metrics.k8s.io"]
    (version,) = group["versions"]
    assert (version["version"], version.get("freshness", "Current")) == ("v1beta1", "Current"), version
    assert {resource["resource"] for resource in version["resources"]} == METRICS

    requests = access_log(adapter.process.log_file)
    wrong = [
        f"{method} {target} (Accept {accept!r}, {agent!r}): {problem}"
        for method, target, accept, agent, status in requests
        if (problem := verdict(target, accept, agent, status)) is not None
    ]
    assert wrong == [], "\n".join(wrong)
    asked_aggregated = sum(1 for _, target, accept, _, _ in requests if target == "/apis" and accept == AGGREGATED)
    assert asked_aggregated > 0, "the v1.37 aggregator asks for aggregated discovery"
    fell_back = sum(1 for _, target, _, _, status in requests if target == GROUP_VERSION and status == 200)
    assert fell_back > 0, "and then reads the group-version document"
    hpa = Counter(status for _, target, _, agent, status in requests if HPA_AGENT in agent)
    assert hpa[200] > 0
    hpa_accepts = sorted({accept for _, _, accept, agent, _ in requests if HPA_AGENT in agent})
    timeline.record(
        f"wire: {len(requests)} requests; the aggregator asked /apis for aggregated discovery {asked_aggregated}x "
        f"-> 406, read {GROUP_VERSION} {fell_back}x -> 200; the HPA's lists (Accept {', '.join(hpa_accepts)}) "
        f"{hpa[200]}x 200, {hpa[503]}x 503; kubectl api-resources lists {len(resources)} metrics"
    )
