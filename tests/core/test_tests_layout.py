"""The tests' own layout (tests/README.md): conftest.py files only register fixtures, so no module imports one;
what tests share lives in plain modules (tests/fixtures/, or a `fixtures.py` beside the tests that use it)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"


def _imports_of_a_conftest(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.ImportFrom):
            names = [node.module or ""] + [f"{node.module or ''}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        if any(name == "conftest" or name.endswith(".conftest") for name in names):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_no_module_imports_from_a_conftest() -> None:
    """A helper imported from a conftest.py belongs in a fixtures module (pytest imports conftests itself)."""
    found = [
        hit
        for path in sorted([*TESTS.rglob("*.py"), *(ROOT / "perf").rglob("*.py")])
        for hit in _imports_of_a_conftest(path)
    ]
    assert found == [], "move what these import into tests/fixtures/ or a fixtures.py beside them: " + ", ".join(found)


def test_every_test_directory_is_a_package() -> None:
    """Tests are packages (module names like tests.sources.redis.test_config), so basenames may repeat."""
    directories = {path.parent for path in TESTS.rglob("*.py")}
    missing = sorted(str(d.relative_to(ROOT)) for d in directories if not (d / "__init__.py").exists())
    assert missing == [], f"add an __init__.py to {missing}"
