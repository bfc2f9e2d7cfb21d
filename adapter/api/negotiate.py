"""Which answers a request's Accept header allows, decided as a Kubernetes apiserver decides it.

The adapter writes one representation: plain `application/json`. A clause of the Accept header
admits it when its media type is `application/json`, `application/*` or `*/*` and it asks for no
transformation: `as`/`g`/`v` (e.g. the aggregator's aggregated discovery,
`application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList`, or kubectl's `as=Table`),
a `stream=` or an `sv=` are representations this server cannot make. Other parameters (`pretty`,
`profile`, unknown ones) do not matter, nor does `q` except `q=0` (RFC 9110: not acceptable).

When no clause admits JSON the answer is 406 NotAcceptable, as a generic apiserver gives: that is
what makes the v1.37 aggregator fall back from aggregated discovery to the group-version document
(kube-aggregator's discovery manager takes any answer that is not a 200 `apidiscovery.k8s.io/v2`
list as "not supported" and then GETs `/apis/<group>/<version>` with `Accept: application/json`).
No Accept header at all means JSON.
"""

from __future__ import annotations

from adapter.api import documents

_OFFERED = "application/json"
# Parameters that ask for a representation other than the object itself: a conversion (present at all,
# even empty, as the apiserver reads it), a stream or a server version (when given a value).
_CONVERSION = frozenset({"as", "g", "v"})
_WHEN_SET = frozenset({"stream", "sv"})

NOT_ACCEPTABLE = documents.status(406, "NotAcceptable", f"only the following media types are accepted: {_OFFERED}")


def accepts_json(accept: str | None) -> bool:
    """True when the Accept header (its first value, as Go's Header.Get reads it) admits plain JSON."""
    if accept is None or not accept.strip():
        return True
    return any(_clause_admits_json(clause) for clause in accept.split(","))


def _clause_admits_json(clause: str) -> bool:
    media_type, *parameters = clause.split(";")
    kind, _, subtype = media_type.strip().lower().partition("/")
    if (kind, subtype) not in (("application", "json"), ("application", "*"), ("*", "*")):
        return False
    for parameter in parameters:
        name, _, value = parameter.partition("=")
        name, value = name.strip().lower(), value.strip().strip('"')
        if name in _CONVERSION or (name in _WHEN_SET and value):
            return False
        if name == "q" and _is_zero(value):
            return False
    return True


def _is_zero(weight: str) -> bool:
    try:
        return float(weight) == 0.0
    except ValueError:
        return False
