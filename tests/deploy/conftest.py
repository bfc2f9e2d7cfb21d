"""Fixtures for the manifest tests: every overlay rendered by the real `kubectl kustomize`."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from adapter.certs import issue, write

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
OVERLAYS = sorted(path.name for path in (DEPLOY / "overlays").iterdir() if (path / "kustomization.yaml").exists())
EXAMPLES = sorted(p for p in (DEPLOY / "examples").glob("*.yaml") if not p.name.endswith(".zeroscale.yaml"))
# The adapter's config for each example, merged into deploy/base/zeroscale.yaml.
EXAMPLE_CONFIGS = sorted((DEPLOY / "examples").glob("*.zeroscale.yaml"))
# The certs overlay renders only after `zeroscale certs` wrote its files.
CERTS_GENERATED = Path("overlays/certs/generated")

Objects = list[dict[str, Any]]


def kustomize(directory: Path) -> Objects:
    if shutil.which("kubectl") is None:
        pytest.fail("kubectl is not installed (make setup installs it)")
    done = subprocess.run(["kubectl", "kustomize", str(directory)], capture_output=True, text=True, timeout=60)
    # The overlays use kustomize v4+ fields (`labels`, `patches`): kubectl 1.21 or newer.
    assert done.returncode == 0, f"kubectl kustomize {directory} failed (kubectl >= 1.21 needed):\n{done.stderr}"
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def find(objects: Objects, kind: str, name: str) -> dict[str, Any]:
    matches = [obj for obj in objects if obj["kind"] == kind and obj["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind} {name}, found {len(matches)}"
    return matches[0]


@pytest.fixture(scope="session")
def deploy_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """deploy/ copied, with the certs overlay's files generated as the README says."""
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


CHART = DEPLOY / "helm" / "zeroscale"
HELM_BUILD = ROOT / "scripts" / "helm" / "build"
# What `helm template` renders for: the release and namespace deploy/base uses, on the release we test against.
RELEASE, RELEASE_NAMESPACE, KUBE_VERSION = "zeroscale", "zeroscale", "1.37.2"


def build_helm() -> Path:
    """Helm built from scripts/helm's pinned module (cached: seconds once built; `make setup` builds it)."""
    done = subprocess.run([str(HELM_BUILD)], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"scripts/helm/build failed:\n{done.stderr}"
    return Path(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def helm() -> Path:
    return build_helm()


def helm_template(helm: Path, *options: str, release: str = RELEASE) -> subprocess.CompletedProcess[str]:
    command = [str(helm), "template", release, str(CHART), "--namespace", RELEASE_NAMESPACE]
    return subprocess.run(
        [*command, "--kube-version", KUBE_VERSION, *options], capture_output=True, text=True, timeout=120
    )


def helm_render(helm: Path, *options: str, release: str = RELEASE) -> Objects:
    done = helm_template(helm, *options, release=release)
    assert done.returncode == 0, f"helm template {' '.join(options)} failed:\n{done.stderr}"
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


@pytest.fixture(scope="session")
def chart_default(helm: Path) -> Objects:
    return helm_render(helm)
