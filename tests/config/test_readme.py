"""The README's `zeroscale serve` example is a valid config."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from adapter.config import ZeroscaleConfig
from adapter.config.delegate import DelegateConfig

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_server_example_loads() -> None:
    section = README.read_text(encoding="utf-8").split("## The external metrics API", 1)[1]
    match = re.search(r"```yaml\n(.*?)```", section, re.DOTALL)
    assert match is not None, "the README's API section has no yaml example"
    config = ZeroscaleConfig(**yaml.safe_load(match.group(1)))
    assert config.server.auth.enabled
    assert config.server.tls.cert_file == Path("/tls/tls.crt")
    assert config.server.auth.request_header.from_configmap


def test_readme_delegate_example_loads() -> None:
    section = README.read_text(encoding="utf-8").split("### The delegate", 1)[1]
    match = re.search(r"```yaml\n(.*?)```", section, re.DOTALL)
    assert match is not None, "the README's delegate section has no yaml example"
    delegate = ZeroscaleConfig(**yaml.safe_load(match.group(1))).delegate
    assert delegate is not None
    assert delegate.address() == ("keda-operator-metrics-apiserver.keda.svc", 443)
    # Every other value the block shows is the default.
    shown = delegate.model_dump(exclude={"service", "ca_file"})
    assert shown == DelegateConfig(service=delegate.service).model_dump(exclude={"service", "ca_file"})
