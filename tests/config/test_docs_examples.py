"""The manual's configuration examples are valid configs and mean what the pages say (tests/fixtures/docs.py)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from adapter.config import ZeroscaleConfig
from adapter.config.delegate import DelegateConfig
from adapter.proxy.dry_run import route_for
from tests.fixtures.docs import ROOT, pages, section, yaml_blocks


def test_the_api_example_loads() -> None:
    (block,) = yaml_blocks(section("reference/apis.md", "## The external metrics API (`zeroscale serve`)"))
    config = ZeroscaleConfig(**yaml.safe_load(block))
    assert config.server.auth.enabled
    assert config.server.tls.cert_file == Path("/tls/tls.crt")
    assert config.server.auth.request_header.from_configmap


def test_the_delegate_example_loads() -> None:
    (block,) = yaml_blocks(section("concepts/beside-keda.md", "## The delegate"))
    delegate = ZeroscaleConfig(**yaml.safe_load(block)).delegate
    assert delegate is not None
    assert delegate.address() == ("keda-operator-metrics-apiserver.keda.svc", 443)
    # Every other value the block shows is the default.
    shown = delegate.model_dump(exclude={"service", "ca_file"})
    assert shown == DelegateConfig(service=delegate.service).model_dump(exclude={"service", "ca_file"})


def test_the_route_objects_example_loads() -> None:
    """ "One route per app, in its namespace": its first block is deploy/examples/route-object.yaml (checked by
    tests/deploy/test_docs_files.py), its second the platform's proxy settings, which load and mean what it says."""
    blocks = yaml_blocks(section("how-to/http-routes.md", "## One route per app, in its namespace"))
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


def test_the_cold_start_example_loads_and_the_dry_run_shown_is_what_it_prints() -> None:
    """ "The cold start as people meet it": its routes load, and the dry run's rule line is the one shown."""
    text = section("how-to/http-routes.md", "## The cold start as people meet it")
    config = ZeroscaleConfig(**yaml.safe_load(yaml_blocks(text)[0])).proxy
    shop, canary = config.routes
    assert shop.waking_page is not None
    assert [rule.when for rule in shop.never_wake] == ["cold", "always"]
    assert canary.match_headers == {"x-canary": "1"}
    navigation = [(b"Accept", b"text/html,application/xhtml+xml,*/*;q=0.8"), (b"Sec-Fetch-Mode", b"navigate")]
    verdict = route_for(config, "GET", "http://shop.example.com/", navigation)
    shown = re.search(r"^(route: .*\nrule: .*)$", text, re.MULTILINE)
    assert shown is not None
    assert "\n".join(verdict.lines[-2:]) == shown.group(1)


_CONFIG_SECTIONS = set(ZeroscaleConfig.model_fields)
# Fenced blocks of the pages, with the `<!-- file: PATH -->` marker when there is one (those are the file itself).
_FENCE = re.compile(r"(<!-- file: \S+ -->\n)?```([a-z]*)\n(.*?)```", re.DOTALL)
# A path of the repository named in a command; what `--out-dir` names, the command makes.
_REPO_PATH = re.compile(r"(?<!--out-dir )\b((?:deploy|scripts|perf|grafana)/[\w./-]*[\w/])")


def _blocks(language: set[str]) -> list[tuple[str, str]]:
    """(where, text) of every fenced block in one of these languages, file blocks left out."""
    found = []
    for page in pages():
        text = page.read_text(encoding="utf-8")
        for block in _FENCE.finditer(text):
            if block.group(1) is None and block.group(2) in language:
                found.append((f"{page.relative_to(ROOT)}:{text[: block.start()].count(chr(10)) + 1}", block.group(3)))
    return found


def _is_hpa_metrics(document: dict[str, Any]) -> bool:
    """An HPA's `metrics:` list shown alone (type External), not the config's `metrics:` section."""
    return any(isinstance(item, dict) and item.get("type") == "External" for item in document.get("metrics") or [])


def _is_config(document: dict[str, Any]) -> bool:
    """A document naming any config section is a config (so a misspelt key beside it is refused, not skipped)."""
    return bool(set(document) & _CONFIG_SECTIONS) and not _is_hpa_metrics(document)


def test_a_config_example_with_a_misspelt_section_is_still_checked() -> None:
    assert _is_config({"proxy": {}, "sever": {}})
    assert not _is_config({"apiVersion": "v1", "kind": "Pod", "spec": {}})
    assert not _is_config({"metrics": [{"type": "External"}]})


def test_every_yaml_example_parses_and_every_config_example_loads() -> None:
    """Every YAML block of the manual is YAML; one that names a config section is a config the processes load."""
    configs = 0
    for where, text in _blocks({"yaml"}):
        for document in yaml.safe_load_all(text):
            assert isinstance(document, dict), f"{where}: not a mapping"
            if _is_config(document):
                try:
                    ZeroscaleConfig(**document)
                except ValidationError as error:
                    raise AssertionError(f"{where}: the example is not a valid config:\n{error}") from None
                configs += 1
    assert configs >= 10


def test_every_repository_path_a_shell_example_names_exists() -> None:
    """The commands the README and the manual show name directories and files the repository has."""
    named = [(where, path) for where, text in _blocks({"", "sh"}) for path in _REPO_PATH.findall(text)]
    assert "deploy/helm/zeroscale" in {path for _, path in named}
    missing = [f"{where}: {path}" for where, path in named if not (ROOT / path).exists()]
    assert not missing, "no such path in the repository:\n" + "\n".join(missing)
