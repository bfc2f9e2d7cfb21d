"""Fixtures for the manifest tests: every overlay rendered by the real `kubectl kustomize`, the chart by real Helm."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from adapter.certs import issue, write
from tests.fixtures.manifests import CERTS_GENERATED, DEPLOY, OVERLAYS, Objects, build_helm, helm_render, kustomize


@pytest.fixture(scope="session")
def deploy_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """deploy/ copied, with the certs overlay's files generated as docs/getting-started/install.md says."""
    copy = tmp_path_factory.mktemp("deploy") / "deploy"
    shutil.copytree(DEPLOY, copy, ignore=shutil.ignore_patterns("generated"))
    write(issue("zeroscale-adapter", "zeroscale", days=30), copy / CERTS_GENERATED)
    return copy


@pytest.fixture(scope="session")
def rendered(deploy_copy: Path) -> dict[str, Objects]:
    return {overlay: kustomize(deploy_copy / "overlays" / overlay) for overlay in OVERLAYS}


@pytest.fixture(scope="session")
def base(deploy_copy: Path) -> Objects:
    return kustomize(deploy_copy / "base")


@pytest.fixture(scope="session")
def helm() -> Path:
    return build_helm()


@pytest.fixture(scope="session")
def chart_default(helm: Path) -> Objects:
    return helm_render(helm)
