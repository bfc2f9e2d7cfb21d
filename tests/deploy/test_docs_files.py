"""The docs' file blocks are the files: each `<!-- file: PATH -->`, in the README or any page under docs/, is
followed by PATH's text, byte for byte."""

from __future__ import annotations

from tests.fixtures.docs import DOCS, FILE_BLOCK, pages
from tests.fixtures.manifests import ROOT

# What "Beside KEDA" must show: the overlay and the examples tests/e2e/test_21_keda.py applies.
BESIDE_KEDA = {
    "deploy/overlays/beside-keda/kustomization.yaml",
    "deploy/overlays/beside-keda/delegate-rbac.yaml",
    "deploy/overlays/beside-keda/adapter-delegate.yaml",
    "deploy/examples/keda-beside-redis.yaml",
    "deploy/examples/keda-external-scalers.yaml",
}


def test_every_file_block_is_its_file() -> None:
    checked = 0
    for page in pages():
        for path, text in FILE_BLOCK.findall(page.read_text(encoding="utf-8")):
            assert text == (ROOT / path).read_text(encoding="utf-8"), (
                f"{page.relative_to(ROOT)}'s block differs from {path}"
            )
            checked += 1
    assert checked > len(BESIDE_KEDA)
    shown = {path for path, _ in FILE_BLOCK.findall((DOCS / "concepts" / "beside-keda.md").read_text(encoding="utf-8"))}
    assert shown >= BESIDE_KEDA


def test_every_file_marker_has_its_block() -> None:
    for page in pages():
        text = page.read_text(encoding="utf-8")
        assert text.count("<!-- file: ") == len(FILE_BLOCK.findall(text)), (
            f"{page.relative_to(ROOT)}: a marker without its block"
        )
