"""The repository stands alone: it cites no document outside it, and every docs/ anchor it cites exists.

Code, comments, manifests and the README cite `docs/protocols.md#anchor` or `docs/architecture.md#anchor`; the
anchors are the `<a id="...">` tags in those files (docs/architecture.md#rules). A renamed or removed anchor, or a
citation of the team notes the project started from, fails here with the file and line to fix.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
# Not part of the repository: environments, caches and build output.
_SKIPPED_DIRS = {".git", ".venv", ".mypy_cache", ".ruff_cache", ".pytest_cache", "__pycache__", "node_modules"}
# Outside documents: the notes named by these words, and any path into a sibling `shared` folder.
_OUTSIDE = re.compile(r"\b(?:SPEC|DESIGN)\b|\.\./shared\b|/work/shared\b")
_CITATION = re.compile(r"\b(protocols|architecture)\.md#([A-Za-z0-9_-]+)")
_IN_PAGE = re.compile(r"\]\(#([A-Za-z0-9_-]+)\)")
_ANCHOR = re.compile(r'<a id="([A-Za-z0-9_-]+)"></a>')


def _text_files() -> Iterator[tuple[Path, str]]:
    for path in sorted(ROOT.rglob("*")):
        relative = path.relative_to(ROOT)
        if any(part in _SKIPPED_DIRS or part.endswith(".egg-info") for part in relative.parts):
            continue
        if not path.is_file() or path == Path(__file__).resolve():
            continue
        try:
            yield relative, path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # binary files cite nothing


def _anchors(name: str) -> set[str]:
    return set(_ANCHOR.findall((DOCS / f"{name}.md").read_text(encoding="utf-8")))


def test_no_file_cites_a_document_outside_the_repository() -> None:
    found = [
        f"{path}:{number}: {line.strip()}"
        for path, text in _text_files()
        for number, line in enumerate(text.splitlines(), 1)
        if _OUTSIDE.search(line)
    ]
    assert not found, "cite docs/protocols.md or docs/architecture.md instead:\n" + "\n".join(found)


def test_every_cited_docs_anchor_exists() -> None:
    anchors = {name: _anchors(name) for name in ("protocols", "architecture")}
    missing = [
        f"{path}:{number}: {document}.md#{anchor}"
        for path, text in _text_files()
        for number, line in enumerate(text.splitlines(), 1)
        for document, anchor in _CITATION.findall(line)
        if anchor not in anchors[document]
    ]
    assert not missing, "no such anchor (docs/ defines them as <a id=...>):\n" + "\n".join(missing)


def test_in_page_links_of_the_docs_exist() -> None:
    for name in ("protocols", "architecture"):
        text = (DOCS / f"{name}.md").read_text(encoding="utf-8")
        missing = set(_IN_PAGE.findall(text)) - _anchors(name)
        assert not missing, f"docs/{name}.md links to missing anchors: {sorted(missing)}"


def test_anchors_are_unique() -> None:
    for name in ("protocols", "architecture"):
        ids = _ANCHOR.findall((DOCS / f"{name}.md").read_text(encoding="utf-8"))
        assert len(ids) == len(set(ids)), f"docs/{name}.md defines an anchor twice"


def test_the_checks_see_what_they_look_for() -> None:
    """The patterns match the forms they exist to catch (so the tests above cannot pass by matching nothing)."""
    assert _OUTSIDE.search("see SPEC 5.4")
    assert _OUTSIDE.search("(DESIGN rule 1)")
    assert _OUTSIDE.search("see ../shared/notes")
    assert not _OUTSIDE.search("_SPECIAL = 1; METRICSPECS; SPEC_FIELDS")
    assert _CITATION.findall("(docs/protocols.md#hpa-behavior)") == [("protocols", "hpa-behavior")]
    assert "hpa-behavior" in _anchors("protocols")
    assert "hot-path" in _anchors("architecture")
    scanned = {path for path, _ in _text_files()}
    assert {Path("README.md"), Path("adapter/cli.py"), Path("deploy/base/apiservice.yaml")} <= scanned
