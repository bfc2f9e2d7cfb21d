"""gRPC and `http` source settings: the manual's examples load, and mistakes are refused with a reason."""

from __future__ import annotations

import re
from typing import Any

import pytest
from pydantic import ValidationError

from adapter.config import ZeroscaleConfig
from adapter.config.http import HTTPMetric, HTTPSource
from adapter.sources import build_source
from adapter.sources.proxy_counts.source import ProxyCounts
from tests.fixtures.docs import yaml_documents


def test_the_docs_grpc_example_loads() -> None:
    (example,) = yaml_documents("how-to/keda.md", "## KEDA and live HTTP counts (gRPC)")
    config = ZeroscaleConfig(**example)
    assert config.grpc.scaler.enabled
    assert config.grpc.scaler.tls is not None
    assert config.grpc.counts.coalesce == 0.002


def test_the_docs_http_source_example_loads() -> None:
    example, hpa = yaml_documents("how-to/http-routes.md", "## The `http` source")
    config = ZeroscaleConfig(**example)
    (source,) = config.sources
    assert isinstance(source, HTTPSource)
    assert source.dns is not None
    assert isinstance(build_source(source), ProxyCounts)
    (metric,) = config.metrics
    assert isinstance(metric, HTTPMetric)
    assert metric.labels["route"].required
    assert hpa["metrics"][0]["external"]["metric"]["selector"] == {"matchLabels": {"route": "web"}}


def test_the_docs_keda_examples_use_both_trigger_types() -> None:
    documents = yaml_documents("how-to/keda.md", "## ScaledObjects calling the scaler")
    triggers = [trigger for document in documents for trigger in document["spec"]["triggers"]]
    assert [trigger["type"] for trigger in triggers] == ["external", "external-push"]
    for trigger in triggers:
        assert {"scalerAddress", "metricName", "labelSelector", "targetValue"} <= set(trigger["metadata"])


@pytest.mark.parametrize(
    ("grpc", "words"),
    [
        ({"scaler": {"enabled": True}}, "grpc.scaler: without tls the server binds only to loopback"),
        ({"counts": {"enabled": True, "bind": "10.0.0.1"}}, "grpc.counts: without tls"),
        ({"scaler": {"enabled": True, "port": 70000}}, "less than or equal to 65535"),
        ({"scaler": {"tls": {"cert_file": "/c"}}}, "key_file"),
        ({"counts": {"heartbeat_interval": 0}}, "greater than 0"),
    ],
)
def test_grpc_mistakes_are_refused(grpc: dict[str, Any], words: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(words)):
        ZeroscaleConfig(grpc=grpc)


def test_plaintext_is_allowed_on_loopback_or_when_said() -> None:
    assert ZeroscaleConfig(grpc={"scaler": {"enabled": True, "bind": "127.0.0.1"}}).grpc.scaler.enabled
    counts = {"enabled": True, "allow_plaintext": True, "allow_unauthenticated": True}
    assert ZeroscaleConfig(grpc={"counts": counts}).grpc.counts.enabled
    assert not ZeroscaleConfig().grpc.scaler.enabled  # off until enabled


@pytest.mark.parametrize(
    ("source", "words"),
    [
        ({}, "set exactly one of dns"),
        ({"dns": "proxy:9091", "proxies": ["a:1"]}, "set exactly one of dns"),
        ({"dns": "no-port"}, "is not host:port"),
        ({"dns": []}, "set exactly one of dns"),
        ({"dns": ["proxy:9091", "no-port"]}, "is not host:port"),
        ({"dns": ["proxy:9091"], "proxies": ["a:1"]}, "set exactly one of dns"),
        ({"proxies": ["a:1", "b"]}, "is not host:port"),
        ({"proxies": ["a:1"], "tls": {"verify_hostname": False}}, "set tls_server_name instead"),
        ({"proxies": ["a:1"], "stale_after": 0}, "greater than 0"),
    ],
)
def test_http_source_mistakes_are_refused(source: dict[str, Any], words: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(words)):
        ZeroscaleConfig(sources=[{"name": "p", "type": "http", **source}])


def test_http_source_dns_is_one_name_or_several() -> None:
    """An old config's one name and a list of names (cluster proxies and sidecars) load alike."""
    one, several = (
        ZeroscaleConfig(sources=[{"name": "p", "type": "http", "dns": dns}]).sources[0]
        for dns in ("proxies:9091", ["proxies:9091", "web-sidecars.shop.svc:9091"])
    )
    assert isinstance(one, HTTPSource)
    assert isinstance(several, HTTPSource)
    assert one.dns_names() == ["proxies:9091"]
    assert several.dns_names() == ["proxies:9091", "web-sidecars.shop.svc:9091"]


def test_http_metric_has_exactly_the_route_label() -> None:
    base = {"name": "pending", "type": "http", "source": "p"}
    with pytest.raises(ValidationError, match="exactly one selector label, route"):
        ZeroscaleConfig(metrics=[{**base, "labels": {"route": {}, "host": {}}}])
    with pytest.raises(ValidationError, match="it is required"):
        ZeroscaleConfig(metrics=[{**base, "labels": {"route": {"required": False}}}])
    with pytest.raises(ValidationError, match="count"):
        ZeroscaleConfig(metrics=[{**base, "count": "everything"}])
