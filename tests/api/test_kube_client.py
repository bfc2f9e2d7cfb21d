"""The minimal Kubernetes client against the Kubernetes stand-in (tests/fixtures/kube_standin.py)."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path

import pytest
import trustme
import yaml

from adapter.config.kube import KubeAPIConfig
from adapter.kube import kubeconfig
from adapter.kube.client import KubeClient
from adapter.kube.errors import KubeAPIError, KubeConfigError, KubeConnectionError
from tests.fixtures.kube_standin import AUTH_CONFIGMAP, KubeStandIn

CONFIGMAPS = f"/api/v1/namespaces/{AUTH_CONFIGMAP[0]}/configmaps"


async def test_token_review_round_trip(kube: KubeStandIn) -> None:
    kube.tokens["good"] = {"username": "alice", "groups": ["team"]}
    client = KubeClient.from_config(kube.client_config())
    try:
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": "good"}}
        for _ in range(3):  # the same keep-alive connection is reused
            status, review = await client.request("POST", "/apis/authentication.k8s.io/v1/tokenreviews", body)
            assert status == 201
            assert review["status"]["user"]["username"] == "alice"
    finally:
        await client.close()
    assert len(kube.token_reviews) == 3
    assert all(headers["authorization"] == f"Bearer {kube.token}" for _, _, headers in kube.requests)


async def test_errors_carry_the_status_message(kube: KubeStandIn) -> None:
    client = KubeClient.from_config(kube.client_config())
    try:
        with pytest.raises(KubeAPIError) as caught:
            await client.request("GET", f"{CONFIGMAPS}/missing")
        assert caught.value.status == 404
        assert caught.value.reason == "NotFound"
        assert caught.value.message == 'configmaps "missing" not found'
    finally:
        await client.close()


async def test_wrong_token_is_401(kube: KubeStandIn, tmp_path: Path) -> None:
    wrong = tmp_path / "token"
    wrong.write_text("not-the-token")
    client = KubeClient.from_config(kube.client_config(token_file=wrong))
    try:
        with pytest.raises(KubeAPIError) as caught:
            await client.request("GET", CONFIGMAPS)
        assert caught.value.status == 401
    finally:
        await client.close()


async def test_token_file_is_reread(kube: KubeStandIn, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kubeconfig, "TOKEN_REREAD_SECONDS", 0.0)
    token_file = tmp_path / "token"
    token_file.write_text("old")
    client = KubeClient.from_config(kube.client_config(token_file=token_file))
    try:
        with pytest.raises(KubeAPIError):
            await client.request("GET", CONFIGMAPS)
        token_file.write_text(kube.token or "")  # the projected token rotated
        status, _ = await client.request("GET", CONFIGMAPS)
        assert status == 200
    finally:
        await client.close()


async def test_unreachable_server_is_a_connection_error(kube: KubeStandIn) -> None:
    port = kube.port
    kube.stop()
    client = KubeClient.from_config(KubeAPIConfig(url=f"http://127.0.0.1:{port}", timeout=2))
    with pytest.raises(KubeConnectionError):
        await client.request("GET", CONFIGMAPS)


async def test_watch_sees_changes_and_ends(kube: KubeStandIn) -> None:
    kube.put(CONFIGMAPS, {"metadata": {"name": "a"}, "data": {"v": "1"}})
    client = KubeClient.from_config(kube.client_config())
    events: list[tuple[str, str]] = []
    first = asyncio.Event()

    async def consume() -> None:
        async for event in client.watch(f"{CONFIGMAPS}?fieldSelector=metadata.name%3Da"):
            events.append((event["type"], event["object"]["data"]["v"]))
            first.set()
            if len(events) == 2:
                kube.end_watches()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(first.wait(), 10)
    kube.put(CONFIGMAPS, {"metadata": {"name": "other"}, "data": {"v": "x"}})  # filtered out
    kube.put(CONFIGMAPS, {"metadata": {"name": "a"}, "data": {"v": "2"}})
    await asyncio.wait_for(task, 10)
    assert events == [("ADDED", "1"), ("MODIFIED", "2")]


async def test_kubeconfig_with_inline_client_certificate(tmp_path: Path) -> None:
    ca = trustme.CA()
    user = ca.issue_cert("kube-user")
    with KubeStandIn(ca, token=None) as kube:
        document = {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "test",
            "contexts": [{"name": "test", "context": {"cluster": "c", "user": "u"}}],
            "clusters": [
                {
                    "name": "c",
                    "cluster": {
                        "server": kube.url,
                        "certificate-authority-data": base64.b64encode(ca.cert_pem.bytes()).decode(),
                    },
                }
            ],
            "users": [
                {
                    "name": "u",
                    "user": {
                        "client-certificate-data": base64.b64encode(user.cert_chain_pems[0].bytes()).decode(),
                        "client-key-data": base64.b64encode(user.private_key_pem.bytes()).decode(),
                    },
                }
            ],
        }
        path = tmp_path / "kubeconfig"
        path.write_text(yaml.safe_dump(document))
        client = KubeClient.from_config(KubeAPIConfig(kubeconfig=path))
        try:
            status, listing = await client.request("GET", CONFIGMAPS)
        finally:
            await client.close()
    assert status == 200
    assert listing["kind"] == "ConfigMapList"


def test_outside_a_cluster_without_settings_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(KubeConfigError, match="not in a cluster"):
        KubeClient.from_config(KubeAPIConfig())
