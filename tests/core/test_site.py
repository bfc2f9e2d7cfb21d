"""The manual builds: `mkdocs build --strict` on mkdocs.yml fails on any warning (a broken link, a missing anchor,
a page under docs/ that the nav leaves out), so `make test` catches them before a reader does."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def _build(project: Path, site: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)]
    # Material's banner about its successor is not a warning of ours.
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run(command, cwd=project, capture_output=True, text=True, timeout=300, env=env)


def test_the_manual_builds_without_a_warning(tmp_path: Path) -> None:
    done = _build(ROOT, tmp_path / "site")
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "site" / "reference" / "security" / "index.html").is_file()


def test_a_missing_anchor_or_page_fails_the_build(tmp_path: Path) -> None:
    """The strict build is a check: a link to an anchor that does not exist, or a page the nav omits, fails it."""
    project = tmp_path / "project"
    shutil.copytree(ROOT / "docs", project / "docs")
    shutil.copy(ROOT / "mkdocs.yml", project / "mkdocs.yml")
    page = project / "docs" / "how-to" / "upgrading.md"
    page.write_text(page.read_text(encoding="utf-8") + "\n[gone](../reference/apis.md#no-such-anchor)\n")
    done = _build(project, tmp_path / "site")
    assert done.returncode == 1
    assert "does not contain an anchor '#no-such-anchor'" in done.stdout + done.stderr
    shutil.copy(ROOT / "docs" / "how-to" / "upgrading.md", page)
    (project / "docs" / "orphan.md").write_text("# Not in the nav\n")
    done = _build(project, tmp_path / "site")
    assert done.returncode == 1
    assert "orphan.md" in done.stdout + done.stderr


# Written by scripts/docs/generate.py from the code: the only pages that may state defaults in a table.
_GENERATED = {Path("reference/configuration.md"), Path("reference/cli.md"), Path("reference/metrics.md")}
_DEFAULT_COLUMN = re.compile(r"^\|(?:[^|\n]*\|)*\s*default\s*\|.*$", re.IGNORECASE | re.MULTILINE)
# Tables whose defaults are not configuration keys (so not in the configuration reference): page -> header.
_NOT_CONFIG = {"how-to/keda.md": "| key | meaning | default |"}  # a KEDA trigger's metadata, read by the scaler


def test_no_hand_written_page_types_defaults_in_a_table() -> None:
    """A default typed by hand drifts from the code: tables of keys link to the configuration reference instead."""
    assert _DEFAULT_COLUMN.search("| key | default | phase |\n|---|---|---|\n")
    typed = [
        f"{page.relative_to(DOCS)}: {header}"
        for page in sorted(DOCS.rglob("*.md"))
        if page.relative_to(DOCS) not in _GENERATED
        for header in _DEFAULT_COLUMN.findall(page.read_text(encoding="utf-8"))
        if _NOT_CONFIG.get(str(page.relative_to(DOCS))) != header
    ]
    assert not typed, f"a table with a default column in {typed}: link to reference/configuration.md instead"


# A config key followed by a value in parentheses: "`cache.query_timeout` (10s)", "`server.bind:port` (default ...)".
_TYPED_DEFAULT = re.compile(
    r"`[a-z_]+(?:[.:][a-z_]+)*`\s+\((?:by default |default )?"  # the key, then "(", "(default "
    r"`?[0-9][0-9.:]*\s?(?:s|ms|m|h|KiB|MiB|GiB)?`?(?:[),]| each)"  # a value and its unit, then ")", ",", " each"
)
# The contributors' design records discuss the values they chose, with the measurements behind them.
_RECORDS = {Path("architecture.md"), Path("protocols.md")}


def test_no_hand_written_page_types_a_default_in_prose() -> None:
    """Nor in a sentence: a key is linked to its entry in the configuration reference, which the code writes."""
    assert _TYPED_DEFAULT.search("bounded by `cache.max_series` (10000) and")
    assert _TYPED_DEFAULT.search("on `server.bind:port` (default `0.0.0.0:6443`),")
    assert not _TYPED_DEFAULT.search("[`cache.max_series`](configuration.md#cache-max_series) (the series table)")
    assert not _TYPED_DEFAULT.search("a coding list that does not end in `chunked` (501 for `gzip, chunked`)")
    typed = [
        f"{page.relative_to(DOCS)}: {match.group(0)}"
        for page in sorted(DOCS.rglob("*.md"))
        if page.relative_to(DOCS) not in _GENERATED | _RECORDS
        for match in _TYPED_DEFAULT.finditer(page.read_text(encoding="utf-8"))
    ]
    assert not typed, f"defaults typed by hand: {typed}: link the key to reference/configuration.md instead"


_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_the_readme_is_a_landing_page_whose_links_resolve() -> None:
    """The README stays short, shows the two commands, and every page it links to exists (MkDocs checks the
    manual's links; the README is outside docs/, so this does)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) < 200
    assert "make demo" in text
    assert "make test" in text
    links = _LINK.findall(text)
    assert "docs/getting-started/install.md" in links
    missing = [link for link in links if not (ROOT / link).is_file()]
    assert not missing, f"the README links to files that do not exist: {missing}"


# A contributors' page cited as a path (`docs/architecture.md#rules`), not as a link: dead text on the site.
_BARE_CITATION = re.compile(r"(?<!\]\()(?<!\[)(?<!\.\./)docs/(?:architecture|protocols)\.md#")


def test_the_manual_links_the_contributors_pages_it_cites() -> None:
    assert _BARE_CITATION.search("the range (docs/architecture.md#no-port-races).")
    assert not _BARE_CITATION.search("[docs/architecture.md#no-port-races](../architecture.md#no-port-races)")
    bare = [
        f"{page.relative_to(DOCS)}:{number}"
        for page in sorted(DOCS.rglob("*.md"))
        if page.relative_to(DOCS) not in _RECORDS
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1)
        if _BARE_CITATION.search(line)
    ]
    assert not bare, f"write these as links, [docs/architecture.md#rules](../architecture.md#rules): {bare}"
