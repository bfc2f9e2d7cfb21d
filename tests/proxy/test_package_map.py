"""adapter/proxy/'s package docstring is its map by role: every module of the package is named there, once."""

from __future__ import annotations

import re
from pathlib import Path

import adapter.proxy

PACKAGE = Path(adapter.proxy.__file__).parent


def test_the_package_docstring_names_every_module_once() -> None:
    doc = adapter.proxy.__doc__ or ""
    modules = sorted(path.name for path in PACKAGE.glob("*.py") if path.name != "__init__.py")
    named = re.findall(r"(?<![/\w])(\w+\.py)\b", doc)  # a module of the package: no directory before it
    missing = [module for module in modules if module not in named]
    assert missing == [], f"name these in adapter/proxy/__init__.py's map, under their role: {missing}"
    unknown = sorted(set(named) - set(modules))
    assert unknown == [], f"adapter/proxy/__init__.py names modules that do not exist: {unknown}"
    twice = sorted({module for module in named if named.count(module) > 1})
    assert twice == [], f"adapter/proxy/__init__.py names these under more than one role: {twice}"
