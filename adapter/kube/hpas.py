"""HorizontalPodAutoscalers of one namespace (autoscaling/v2): where to list them, and what they say about their
scale targets."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from adapter.kube.client import KubeClient
from adapter.kube.errors import KubeConnectionError
from adapter.kube.watching import field, items_of

# A list asks for at most this many HPAs an answer (client-go's pager asks for as many) and follows `continue` to the
# last page: a namespace of thousands is parsed a page at a time (45 ms each, loaded), never all at once in the loop.
PAGE_SIZE = 500


def hpas_path(namespace: str) -> str:
    return f"/apis/autoscaling/v2/namespaces/{quote(namespace, safe='')}/horizontalpodautoscalers"


async def list_hpas(kube: KubeClient, namespace: str) -> list[dict[str, Any]]:
    """The namespace's HPAs, read from the API now (a list: never a watch's copy), every page of it: a partial list
    could miss the one HPA that refuses. An HPA without a name still counts (only a non-object is skipped); an answer
    without an `items` list, or whose `continue` names a page already read (it would never end), is no list:
    KubeConnectionError, as for no answer."""
    hpas: list[dict[str, Any]] = []
    token, read = "", set()
    while True:
        page = f"?limit={PAGE_SIZE}" + (f"&continue={quote(token, safe='')}" if token else "")
        _, listing = await kube.request("GET", hpas_path(namespace) + page)
        read.add(token)
        items = listing.get("items")
        token = field(listing, "metadata").get("continue") or ""
        if not isinstance(items, list) or not isinstance(token, str) or (token and token in read):
            raise KubeConnectionError(
                f"the HorizontalPodAutoscaler list of {namespace} does not parse (no items, or a continue repeated)"
            )
        hpas += (item for item in items if isinstance(item, dict))
        if not token:
            return hpas


def hpa_name(hpa: dict[str, Any]) -> str:
    name = field(hpa, "metadata").get("name")
    return name if isinstance(name, str) and name else "(no name)"


def targets(hpa: dict[str, Any], group: str, kind: str, name: str) -> bool:
    """The HPA scales this workload: its scaleTargetRef names the same API group (of any version: `apps/v1` and
    `apps/v1beta2` are one group, `v1` is the core group ""), kind and name, as the HPA controller resolves it.
    Another group's kind of the same name (a CRD called Deployment) is another workload."""
    ref = field(field(hpa, "spec"), "scaleTargetRef")
    api_version = ref.get("apiVersion")
    if not isinstance(api_version, str):
        return False
    ref_group = api_version.rpartition("/")[0]
    return bool(ref_group == group and ref.get("kind") == kind and ref.get("name") == name)


def scaled_to_zero(hpa: dict[str, Any]) -> bool:
    """The HPA's ScaledToZero condition is True: the HPA itself took its target to zero (Kubernetes v1.37+)."""
    for condition in items_of(field(hpa, "status"), "conditions"):
        if isinstance(condition, dict) and condition.get("type") == "ScaledToZero":
            return bool(condition.get("status") == "True")
    return False
