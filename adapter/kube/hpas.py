"""HorizontalPodAutoscalers of one namespace (autoscaling/v2): where to list them, and what they say about their
scale targets."""

from __future__ import annotations

from typing import Any, NamedTuple
from urllib.parse import quote

from adapter.kube.client import KubeClient
from adapter.kube.errors import KubeConnectionError
from adapter.kube.watching import field, items_of

# A list asks for at most this many HPAs an answer (client-go's pager asks for as many) and follows `continue` to the
# last page: a namespace of thousands is parsed a page at a time, never all at once in the event loop.
PAGE_SIZE = 500


class HPA(NamedTuple):
    """What a wake needs of one HPA, kept instead of its object: a list of thousands holds one page of JSON objects
    at a time, and the garbage collector's full passes walk a few strings, not every HPA's managedFields."""

    name: str
    # The scaleTargetRef: its API group (of any version: `apps/v1` and `apps/v1beta2` are one group, `v1` is the
    # core group ""), kind and name, as the HPA controller resolves it; None where absent or not a string.
    group: str | None
    kind: str | None
    target: str | None
    # Its ScaledToZero condition is True: the HPA itself took its target to zero (Kubernetes v1.37+).
    scaled_to_zero: bool

    @classmethod
    def read(cls, hpa: dict[str, Any]) -> HPA:
        """From an HPA object; a malformed one reads as one without the fields it lacks (it scales nothing)."""
        name = field(hpa, "metadata").get("name")
        ref = field(field(hpa, "spec"), "scaleTargetRef")
        api_version, kind, target = (ref.get(key) for key in ("apiVersion", "kind", "name"))
        return cls(
            name if isinstance(name, str) and name else "(no name)",
            api_version.rpartition("/")[0] if isinstance(api_version, str) else None,
            kind if isinstance(kind, str) else None,
            target if isinstance(target, str) else None,
            _scaled_to_zero(hpa),
        )

    def targets(self, group: str, kind: str, name: str) -> bool:
        """It scales this workload; another group's kind of the same name (a CRD called Deployment) is another."""
        return self.group == group and self.kind == kind and self.target == name


def hpas_path(namespace: str) -> str:
    return f"/apis/autoscaling/v2/namespaces/{quote(namespace, safe='')}/horizontalpodautoscalers"


async def list_hpas(kube: KubeClient, namespace: str) -> list[HPA]:
    """The namespace's HPAs, read from the API now (a list: never a watch's copy), every page of it: a partial list
    could miss the one HPA that refuses. An HPA without a name still counts (only a non-object is skipped); an answer
    without an `items` list, or whose `continue` names a page already read (it would never end), is no list:
    KubeConnectionError, as for no answer."""
    hpas: list[HPA] = []
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
        hpas += (HPA.read(item) for item in items if isinstance(item, dict))
        if not token:
            return hpas


def _scaled_to_zero(hpa: dict[str, Any]) -> bool:
    for condition in items_of(field(hpa, "status"), "conditions"):
        if isinstance(condition, dict) and condition.get("type") == "ScaledToZero":
            return bool(condition.get("status") == "True")
    return False
