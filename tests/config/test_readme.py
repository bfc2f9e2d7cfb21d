"""The README's `zeroscale serve` example is a valid config."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from adapter.config import ZeroscaleConfig
from adapter.config.delegate import DelegateConfig
from adapter.proxy.dry_run import route_for

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


def test_readme_route_objects_example_loads() -> None:
    """ "One route per app, in its namespace": its first block is deploy/examples/route-object.yaml (checked by
    tests/deploy/test_readme_files.py), its second the platform's proxy settings, which load and mean what it says."""
    section = README.read_text(encoding="utf-8").split("## One route per app, in its namespace", 1)[1]
    blocks = re.findall(r"```yaml\n(.*?)```", section.split("\n## ", 1)[0], re.DOTALL)
    assert len(blocks) == 2, "the section shows the example file and the platform's settings"
    objects = ZeroscaleConfig(**yaml.safe_load(blocks[1])).proxy.route_objects
    assert objects.enabled
    assert objects.allowed_namespace("shop")
    assert not objects.allowed_namespace("bank")
    (grant,) = objects.hosts
    assert grant.allows("shop", "api.shop.apps.example.com")
    assert not grant.allows("shop", "cart.apps.example.com")
    assert objects.max_limits.hold_timeout == 300
    assert objects.activator_ports is not None
    assert 9150 in objects.activator_ports


def test_readme_cold_start_example_loads_and_the_dry_run_shown_is_what_it_prints() -> None:
    """ "The cold start as people meet it": its routes load, and the dry run's rule line is the one shown."""
    section = README.read_text(encoding="utf-8").split("### The cold start as people meet it", 1)[1]
    section = section.split("\n### ", 1)[0]
    block = re.search(r"```yaml\n(.*?)```", section, re.DOTALL)
    assert block is not None
    config = ZeroscaleConfig(**yaml.safe_load(block.group(1))).proxy
    shop, canary = config.routes
    assert shop.waking_page is not None
    assert [rule.when for rule in shop.never_wake] == ["cold", "always"]
    assert canary.match_headers == {"x-canary": "1"}
    navigation = [(b"Accept", b"text/html,application/xhtml+xml,*/*;q=0.8"), (b"Sec-Fetch-Mode", b"navigate")]
    verdict = route_for(config, "GET", "http://shop.example.com/", navigation)
    shown = re.search(r"^(route: .*\nrule: .*)$", section, re.MULTILINE)
    assert shown is not None
    assert "\n".join(verdict.lines[-2:]) == shown.group(1)
