"""The README's file blocks are the files: each `<!-- file: PATH -->` is followed by PATH's text, byte for byte."""

from __future__ import annotations

import re

from tests.fixtures.manifests import ROOT

README = ROOT / "README.md"
_BLOCK = re.compile(r"<!-- file: (\S+) -->\n```[a-z]*\n(.*?)```\n", re.DOTALL)
# What the "Beside KEDA" section must show: the overlay and the examples tests/e2e/test_21_keda.py applies.
BESIDE_KEDA = {
    "deploy/overlays/beside-keda/kustomization.yaml",
    "deploy/overlays/beside-keda/delegate-rbac.yaml",
    "deploy/overlays/beside-keda/adapter-delegate.yaml",
    "deploy/examples/keda-beside-redis.yaml",
    "deploy/examples/keda-external-scalers.yaml",
}


def test_every_file_block_is_its_file() -> None:
    blocks = _BLOCK.findall(README.read_text(encoding="utf-8"))
    assert {path for path, _ in blocks} >= BESIDE_KEDA
    for path, text in blocks:
        assert text == (ROOT / path).read_text(encoding="utf-8"), f"README's block differs from {path}"


def test_every_file_marker_has_its_block() -> None:
    text = README.read_text(encoding="utf-8")
    assert text.count("<!-- file: ") == len(_BLOCK.findall(text))
