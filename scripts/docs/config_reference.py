"""docs/reference/configuration.md: every key of the config file, read from the models (adapter/config).

Each key's type and description come from the field (its attribute docstring), its default from the model, written
as a person writes it in YAML (durations with a unit, sizes as numbers); the limit's metric where one counts it.
"""

from __future__ import annotations

import ast
import json
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, TypeAdapter
from pydantic.fields import FieldInfo

from adapter.config import ZeroscaleConfig
from adapter.config.base import Duration
from adapter.config.proxy import SidecarConfig
from adapter.config.route import AddressUpstream, LocalScaleTarget, ScaleTarget, ServiceUpstream
from scripts.docs.mdtext import inline

Schema = dict[str, Any]

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "reference" / "configuration.md"

# Members of a union of models that no `type` key tells apart: the word their keys' paths carry in parentheses.
VARIANTS: dict[type[BaseModel], str] = {
    ServiceUpstream: "service",
    AddressUpstream: "address",
    ScaleTarget: "workload",
    LocalScaleTarget: "local",
}
# Defaults computed where the process runs, not fixed in the model: what the page says instead of this machine's.
COMPUTED: dict[tuple[type[BaseModel], str], str] = {(SidecarConfig, "namespace"): "the pod's namespace"}
# The adapter's limits and the series that count their hits (the proxy's are found in its code: proxy_limit_labels).
ADAPTER_LIMITS: dict[str, str] = {
    "server.max_connections": 'zeroscale_api_connections_refused_total{listener="api"}',
    "server.max_connections_per_source": 'zeroscale_api_connections_refused_total{listener="api"}',
    "server.metrics_max_connections": 'zeroscale_api_connections_refused_total{listener="metrics"}',
    "server.metrics_max_connections_per_source": 'zeroscale_api_connections_refused_total{listener="metrics"}',
    "server.body_timeout": 'zeroscale_api_timeouts_total{phase="body"}',
    "server.response_timeout": 'zeroscale_api_timeouts_total{phase="response"}',
    "server.idle_timeout": 'zeroscale_api_timeouts_total{phase="idle"}',
    "server.auth.max_token_reviews": 'zeroscale_api_authentications_total{result="busy"}',
    "server.auth.max_access_reviews": 'zeroscale_api_authorizations_total{decision="busy"}',
    "cache.max_series": 'zeroscale_series_refused_total{limit="max_series"}',
    "cache.max_series_per_namespace": 'zeroscale_series_refused_total{limit="max_series_per_namespace"}',
    "cache.max_staleness": "zeroscale_stale_reads_total",
    "sources[kafka].partition_lag_series_limit": "zeroscale_kafka_partition_lag_series_dropped_total",
    **{
        f"grpc.{server}.{limit}": f'zeroscale_grpc_streams_refused_total{{server="{server}",limit="{limit}"}}'
        for server in ("scaler", "counts")
        for limit in ("max_streams", "max_streams_per_peer")
    },
    **{
        f"grpc.{server}.max_connections": f'zeroscale_grpc_connection_limit_reached_total{{server="{server}"}}'
        for server in ("scaler", "counts")
    },
}
PROXY_LIMIT_HITS = "zeroscale_proxy_limit_hits_total"
# Where a route's limits sit; their hits are labelled by the limit's own key.
_ROUTE_LIMITS = ("routes[].limits.", "sidecar.limits.")


@dataclass(frozen=True)
class Key:
    path: str
    type: str
    default: str | None  # None: a section, whose keys follow
    description: str
    env: str | None
    limit: str | None


def anchor(path: str) -> str:
    """`proxy.routes[].limits.hold_timeout` -> `proxy-routes-limits-hold_timeout`; a variant's tag is a part."""
    text = path.lower().replace("[]", "")
    for mark in "[]().":
        text = text.replace(mark, "-")
    return "-".join(part for part in text.split("-") if part)


def proxy_limit_labels(package: Path = ROOT / "adapter" / "proxy") -> frozenset[str]:
    """The `limit` label values the proxy counts hits under: the string constants given to LIMIT_HITS.labels, and
    `<prefix><limit>` for each limit named to a function that counts `f"<prefix>{limit}"` (`http2.` ones)."""
    labels: set[str] = set()
    prefixed: dict[str, str] = {}  # function name -> the prefix its `limit` argument is counted under
    trees = [ast.parse(path.read_text(encoding="utf-8")) for path in sorted(package.glob("*.py"))]
    for tree in trees:
        for function in ast.walk(tree):
            if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for call in _calls(function, "labels"):
                if not (isinstance(call.func, ast.Attribute) and _named(call.func.value, "LIMIT_HITS")):
                    continue
                limit = call.args[-1]
                if isinstance(limit, ast.Constant) and isinstance(limit.value, str):
                    labels.add(limit.value)
                elif isinstance(limit, ast.JoinedStr) and isinstance(limit.values[0], ast.Constant):
                    prefixed[function.name] = str(limit.values[0].value)
    for tree in trees:
        for name, prefix in prefixed.items():
            for call in _calls(tree, name):
                first = call.args[0]
                if isinstance(first, ast.Constant) and isinstance(first.value, str):
                    labels.add(prefix + first.value)
    return frozenset(labels)


def _calls(tree: ast.AST, name: str) -> Iterator[ast.Call]:
    """Calls of `name` (a function, or a method of anything) with at least one positional argument."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args and _named(node.func, name):
            yield node


def _named(node: ast.AST, name: str) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == name) or (isinstance(node, ast.Name) and node.id == name)


def limit_metric(path: str, proxy_labels: frozenset[str]) -> str | None:
    if path in ADAPTER_LIMITS:
        return ADAPTER_LIMITS[path]
    if not path.startswith("proxy."):
        return None
    label = path.removeprefix("proxy.")
    for place in _ROUTE_LIMITS:
        label = label.removeprefix(place)
    return f'{PROXY_LIMIT_HITS}{{limit="{label}"}}' if label in proxy_labels else None


@cache
def _schema(model: type[BaseModel]) -> Schema:
    return model.model_json_schema()


@cache
def _duration_branches() -> list[Schema]:
    return list(TypeAdapter(Duration).json_schema()["anyOf"])


def type_text(prop: Schema) -> str:
    """How a person reads a property's JSON schema: `duration`, `list of strings`, `"kafka"`..."""
    if "$ref" in prop:
        return "object"
    branches = prop.get("anyOf") or prop.get("oneOf")
    if branches is not None:
        others = [branch for branch in branches if branch.get("type") != "null"]
        if others == _duration_branches():
            return "duration"
        return " or ".join(dict.fromkeys(type_text(branch) for branch in others))
    if "const" in prop:
        return f"`{prop['const']}`"
    if "enum" in prop:
        return "one of " + ", ".join(f"`{value}`" for value in prop["enum"])
    kind = prop.get("type")
    if kind == "array":
        return f"list of {_plural(type_text(prop.get('items', {})))}"
    if kind == "object":
        return f"map of string to {_plural(type_text(prop.get('additionalProperties', {})))}"
    if kind == "string" and prop.get("format") == "path":
        return "file path"
    return str(kind or "any")


def _plural(text: str) -> str:
    if text in ("object", "string", "integer", "number", "boolean", "duration", "file path"):
        return text + "s"
    return f"({text})"


def duration_text(seconds: float) -> str:
    """Seconds as a person writes them in the config: `2m`, `250ms`, `10s`, `1h`."""
    for unit, size in (("h", 3600.0), ("m", 60.0), ("s", 1.0)):
        if seconds >= size and (seconds / size).is_integer():
            return f"{int(seconds / size)}{unit}"
    milliseconds = seconds * 1000
    if seconds and round(milliseconds, 6).is_integer():
        return f"{round(milliseconds)}ms"
    return f"{seconds:g}s"


def _size_note(value: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if value >= size and value % size == 0:
            return f" ({value // size} {unit})"
    return ""


def default_text(model: type[BaseModel], name: str, field: FieldInfo, prop: Schema) -> str | None:
    if (model, name) in COMPUTED:
        return COMPUTED[(model, name)]
    if field.is_required():
        return "none (required)"
    value = field.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return None
    if value is None:
        return "unset"
    if type_text(prop) == "duration":
        return f"`{duration_text(float(value))}`"
    if isinstance(value, bool):
        return f"`{json.dumps(value)}`"
    if isinstance(value, int):
        return f"`{value}`" + (_size_note(value) if name.endswith("_bytes") else "")
    if isinstance(value, float):
        return f"`{value:g}`"
    if isinstance(value, str):
        # Quoted where YAML would read the bare text as something else (`1.2` a number, "" nothing).
        return f"`{value}`" if value and yaml.safe_load(value) == value else f"`{json.dumps(value)}`"
    dumped = TypeAdapter(type(value)).dump_python(value, mode="json")
    return f"`{json.dumps(dumped, separators=(', ', ': '))}`"


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The models a field's annotation holds (in a union, a list, a dict's values), in order."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    found: list[type[BaseModel]] = []
    for argument in typing.get_args(annotation):
        found += [model for model in _models_in(argument) if model not in found]
    return found


def _container(annotation: Any) -> str:
    """`[]` for a list of models, `.NAME` for a dict of them, "" for a model itself (None and unions looked through)."""
    origin = typing.get_origin(annotation)
    if origin is list:
        return "[]"
    if origin is dict:
        return ".NAME"
    if origin in (typing.Union, types.UnionType, typing.Annotated):
        return next((mark for mark in map(_container, typing.get_args(annotation)) if mark), "")
    return ""


def _tag(model: type[BaseModel]) -> str:
    kind = model.model_fields.get("type")
    if kind is not None and len(typing.get_args(kind.annotation)) == 1:
        return str(typing.get_args(kind.annotation)[0])
    if model not in VARIANTS:
        raise SystemExit(f"{model.__name__} is one of a union of models: name its variant in VARIANTS ({__file__})")
    return VARIANTS[model]


def keys(
    model: type[BaseModel], prefix: str = "", env: bool = True, proxy_labels: frozenset[str] = frozenset()
) -> Iterator[Key]:
    """Every key under `model`, depth first, each section before its keys."""
    properties = _schema(model)["properties"]
    for name, field in model.model_fields.items():
        path = f"{prefix}.{name}" if prefix else name
        prop = properties[name]
        yield Key(
            path=path,
            type=type_text(prop),
            default=default_text(model, name, field, prop),
            description=field.description or "",
            env=f"ZEROSCALE_{path.upper().replace('.', '__')}" if env else None,
            limit=limit_metric(path, proxy_labels),
        )
        models = _models_in(field.annotation)
        mark = _container(field.annotation)
        for member in models:
            if len(models) == 1:
                inner = f"{path}{mark}"
            elif mark == "[]":
                inner = f"{path}[{_tag(member)}]"
            else:
                inner = f"{path}{mark}({_tag(member)})"
            yield from keys(member, inner, env and not mark, proxy_labels)


def config_keys() -> list[Key]:
    return list(keys(ZeroscaleConfig, proxy_labels=proxy_limit_labels()))


INTRO = """\
# Configuration reference

<!-- Generated by scripts/docs/generate.py from the configuration models (adapter/config): edit a field's
     docstring there, then run `.venv/bin/python scripts/docs/generate.py`. tests/core/test_reference_docs.py fails
     when this page is stale. -->

Every key of the config file that `zeroscale serve` and `zeroscale proxy` read (the Helm chart's `config` value),
with its type, default and description, all taken from the configuration models. Unknown keys are errors.

- **Key paths**: `a.b` is key `b` inside `a`; `a[]` is each item of the list `a`; `sources[kafka]` is an item of
  `sources` with `type: kafka` (likewise `metrics[...]`); `upstream(service)` is the form of `upstream` that names a
  Service (beside `upstream(address)`); `NAME` is a name you choose (a selector label's).
- **Durations** are seconds as a number or a string with a unit: `500ms`, `5s`, `2m`, `1h`.
- **Environment**: a key outside a list can be set as `ZEROSCALE_` followed by its path in upper case with `__`
  between the parts (`proxy.port`: `ZEROSCALE_PROXY__PORT=8080`); the environment wins over the file. A section or
  a list is given as JSON (`ZEROSCALE_PROXY__SIDECAR='{"upstream": "127.0.0.1:8081"}'`).
- **Limit metric**: the series that counts the times the limit was reached, where one does.
"""


def render(entries: list[Key]) -> str:
    parts = [INTRO]
    for key in entries:
        level = "##" if "." not in key.path else "###"
        parts.append(f"\n{level} `{key.path}` {{#{anchor(key.path)}}}\n\n")
        facts = [f"Type: {key.type}"]
        if key.default is not None:
            facts.append(f"Default: {key.default}")
        if key.env is not None:
            facts.append(f"Environment: `{key.env}`")
        if key.limit is not None:
            facts.append(f"Limit metric: `{key.limit}`")
        parts.append("".join(f"- {fact}\n" for fact in facts))
        if key.description:
            parts.append(f"\n{inline(key.description)}\n")
    return "".join(parts)


def page() -> str:
    return render(config_keys())
