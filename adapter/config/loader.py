"""Reads the YAML file, applies environment overrides, and reports every problem at once."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from adapter.config.base import SecretFile, TLSClientFiles
from adapter.config.kube import KubeAPIConfig
from adapter.config.model import ZeroscaleConfig
from adapter.redact import redact

CONFIG_ENV = "ZEROSCALE_CONFIG"


class ConfigError(Exception):
    """The configuration was refused; `problems` holds one line per problem, naming file and key path."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


def _key_path(loc: Iterable[int | str], document: Any) -> str:
    """Render a pydantic location as `metrics[2].labels.group`, skipping the union tag pydantic inserts."""
    parts: list[str] = []
    node = document
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
            node = node[item] if isinstance(node, list) and item < len(node) else None
            continue
        if isinstance(node, dict) and item not in node and node.get("type") == item:
            continue  # the discriminator tag, not a key the user wrote
        parts.append(f".{item}" if parts else item)
        node = node.get(item) if isinstance(node, dict) else None
    return "".join(parts) or "(top level)"


def _env_name(loc: Iterable[int | str]) -> str | None:
    """The environment variable that set the value at `loc` (it, or the section holding it given as JSON), if any:
    a bad override is named as such, not blamed on the file it overrode."""
    names = {name.upper() for name in os.environ}
    parts: list[str] = []
    for item in loc:
        if not isinstance(item, str):
            break  # inside a list: only the whole list is set from the environment
        parts.append(item.upper())
        name = "ZEROSCALE_" + "__".join(parts)
        if name in names:
            return name
    return None


def _problem(origin: str, loc: tuple[int | str, ...], document: Any, message: str) -> str:
    env = _env_name(loc)
    where = f"{origin}: {_key_path(loc, document)}"
    return f"{where} (from the environment, {env}): {message}" if env else f"{where}: {message}"


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError([f"{path}: cannot read the config file: {err.strerror}"]) from err
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as err:
        # The error quotes the line it stopped at: a credential written there by mistake is not repeated.
        raise ConfigError([f"{path}: not valid YAML: {redact(str(err))}"]) from err
    if document is None:
        return {}
    if not isinstance(document, dict):
        raise ConfigError([f"{path}: the top level must be a mapping of keys, not {type(document).__name__}"])
    return document


def _cross_references(config: ZeroscaleConfig, origin: str) -> list[str]:
    problems: list[str] = []
    for kind, names in (
        ("source", [source.name for source in config.sources]),
        ("metric", [metric.key for metric in config.metrics]),
    ):
        for name, count in Counter(names).items():
            if count > 1:
                problems.append(f"{origin}: {kind}s: the name {name!r} is used {count} times; names must be unique")
    for index, metric in enumerate(config.metrics):
        source = config.source_named(metric.source)
        where = f"{origin}: metrics[{index}].source"
        if source is None:
            defined = ", ".join(sorted(s.name for s in config.sources)) or "none"
            problems.append(f"{where}: no source named {metric.source!r} is defined (defined: {defined})")
        elif source.type != metric.type:
            problems.append(
                f"{where}: source {metric.source!r} is of type {source.type!r} "
                f"but the metric is of type {metric.type!r}"
            )
    return problems


def _page_files(config: ZeroscaleConfig, origin: str) -> list[str]:
    """The routes' waking page files, read now: one that cannot be served is an error at load, naming the file."""
    problems: list[str] = []
    for index, route in enumerate(config.proxy.routes):
        if route.waking_page is not None and route.waking_page.body_file:
            try:
                route.waking_page.page_body()
            except ValueError as err:
                problems.append(f"{origin}: proxy.routes[{index}]: {err}")
    return problems


# Files that hold credentials or trust, wherever they appear: a missing one is a configuration error at
# load, named by its key, not a connection failure much later ("cannot reach redis ... No such file").
_CREDENTIAL_FILES: dict[type[BaseModel], tuple[str, ...]] = {
    SecretFile: ("file",),
    TLSClientFiles: ("ca_file", "cert_file", "key_file"),
    KubeAPIConfig: ("kubeconfig", "ca_file", "token_file", "client_cert_file", "client_key_file"),
}


def _unreadable_files(node: object, where: str) -> Iterator[str]:
    """`key.path: why` for every credential file under `node` that cannot be read now."""
    if isinstance(node, BaseModel):
        for name in _CREDENTIAL_FILES.get(type(node), ()):
            file = getattr(node, name)
            if file is not None:
                problem = _unreadable(Path(file))
                if problem is not None:
                    yield f"{where}.{name}: {problem}" if where else f"{name}: {problem}"
        for name in type(node).model_fields:
            yield from _unreadable_files(getattr(node, name), f"{where}.{name}" if where else name)
    elif isinstance(node, list | tuple):
        for index, item in enumerate(node):
            yield from _unreadable_files(item, f"{where}[{index}]")


def _unreadable(path: Path) -> str | None:
    try:
        with path.open("rb") as opened:
            opened.read(1)
    except OSError as err:
        return f"cannot read {path}: {err.strerror or err} (the file must exist and be readable when Zeroscale starts)"
    return None


def load_config(path: Path | str | None = None, *, read_files: bool = False) -> ZeroscaleConfig:
    """Load `path` (or $ZEROSCALE_CONFIG, or nothing) with environment overrides; raise ConfigError.

    `read_files`: also refuse credential files (`{file: ...}` secrets, TLS and Kubernetes credential
    files) that cannot be read now, as the commands that run or check a config do.
    """
    chosen = path if path is not None else os.environ.get(CONFIG_ENV)
    document = _read_yaml(Path(chosen)) if chosen else {}
    origin = str(chosen) if chosen else "(environment)"
    try:
        config = ZeroscaleConfig(**document)
    except ValidationError as err:
        raise ConfigError([_problem(origin, e["loc"], document, e["msg"]) for e in err.errors()]) from None
    problems = _cross_references(config, origin) + _page_files(config, origin)
    if read_files:
        problems += [f"{origin}: {problem}" for problem in _unreadable_files(config, "")]
    if problems:
        raise ConfigError(problems)
    return config
