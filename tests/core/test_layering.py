"""The package graph of adapter/ has no cycles, and the wire vocabulary sits at its bottom.

Nodes are adapter's top-level packages and modules (`adapter.sources.kafka.lag` counts as `sources`);
an edge is any import of another node, function-level (lazy) and TYPE_CHECKING imports included, found
by parsing each file (nothing is imported). A cycle means two packages can only be understood together.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ADAPTER = Path(__file__).resolve().parents[2] / "adapter"


def _node(path: Path) -> str:
    return path.relative_to(ADAPTER).parts[0].removesuffix(".py")


def _imported(tree: ast.AST) -> Iterator[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)  # `from adapter import cli`


def package_graph() -> dict[str, set[str]]:
    nodes = {_node(path) for path in ADAPTER.rglob("*.py")} - {"__init__"}  # adapter/__init__.py: no node
    graph: dict[str, set[str]] = {node: set() for node in nodes}
    for path in ADAPTER.rglob("*.py"):
        source = _node(path)
        if source == "__init__":
            continue
        for name in _imported(ast.parse(path.read_text())):
            parts = name.split(".")
            if parts[0] == "adapter" and len(parts) > 1 and parts[1] in nodes and parts[1] != source:
                graph[source].add(parts[1])
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every cycle found by a depth-first walk, each as its path (first node repeated at the end)."""
    found: list[list[str]] = []
    done: set[str] = set()

    def walk(node: str, path: list[str]) -> None:
        if node in path:
            found.append([*path[path.index(node) :], node])
            return
        if node in done:
            return
        for target in sorted(graph[node]):
            walk(target, [*path, node])
        done.add(node)

    for node in sorted(graph):
        walk(node, [])
    return found


def test_the_finder_sees_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_package_graph_has_no_cycles() -> None:
    graph = package_graph()
    assert {"api", "proxy", "sources", "metrics", "hpa", "k8s_wire", "kube", "rpc"} <= set(graph)
    assert cycles(graph) == []


def test_the_wire_vocabulary_is_at_the_bottom() -> None:
    graph = package_graph()
    assert graph["k8s_wire"] == set()
    for user in ("api", "hpa", "metrics", "sources"):
        assert "k8s_wire" in graph[user], user
