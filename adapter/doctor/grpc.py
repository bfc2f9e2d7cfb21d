"""Whether the installation's gRPC ports let a caller without a client certificate in (issue: the scaler as
shipped once had no authentication). The config is read where the pods read it: the ConfigMaps the
adapter's Deployment mounts; the adapter and the proxies share it, so both gRPC servers are covered.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import yaml
from pydantic import ValidationError

from adapter.config.grpc import GRPCConfig
from adapter.doctor.findings import Finding
from adapter.kube.errors import KubeError

CHECK = "gRPC client certificates"
_HINT = "set grpc.<server>.tls.client_ca_file and remove allow_unauthenticated (docs/reference/security.md)"

Get = Callable[[str], Awaitable[dict[str, Any] | None]]


async def mounted_configs(
    get: Get, namespace: str, deployment: str, keys: tuple[str, ...] = ("grpc", "server")
) -> list[dict[str, Any]] | str:
    """Every YAML document with one of `keys` in the Deployment's ConfigMaps, or why there are none."""
    found = await get(f"/apis/apps/v1/namespaces/{namespace}/deployments/{deployment}")
    if found is None:
        return f"no Deployment {namespace}/{deployment}"
    volumes = ((found.get("spec") or {}).get("template") or {}).get("spec", {}).get("volumes") or []
    configs = []
    for volume in volumes:
        name = (volume.get("configMap") or {}).get("name")
        if not name:
            continue
        config_map = await get(f"/api/v1/namespaces/{namespace}/configmaps/{name}")
        for text in ((config_map or {}).get("data") or {}).values():
            try:
                document = yaml.safe_load(text)
            except yaml.YAMLError:
                continue
            if isinstance(document, dict) and any(key in document for key in keys):
                configs.append(document)
    return configs or f"no Zeroscale config in the ConfigMaps Deployment {namespace}/{deployment} mounts"


async def check_grpc_authentication(get: Get, namespace: str, deployment: str) -> list[Finding]:
    try:
        configs = await mounted_configs(get, namespace, deployment)
    except KubeError as err:
        return [Finding("skip", CHECK, f"cannot read the adapter's config: {err}")]
    if isinstance(configs, str):
        return [Finding("skip", CHECK, configs)]
    findings = []
    for config in configs:
        try:
            grpc = GRPCConfig.model_validate(config.get("grpc") or {})
        except ValidationError as err:
            first = err.errors()[0]["msg"]
            findings.append(Finding("fail", CHECK, f"the grpc settings do not load, the pods will not start: {first}"))
            continue
        warnings = grpc.unauthenticated()
        findings += [Finding("warn", CHECK, warning, _HINT) for warning in warnings]
        if not warnings:
            findings.append(Finding("ok", CHECK, "every gRPC server off loopback requires a client certificate"))
    return findings
