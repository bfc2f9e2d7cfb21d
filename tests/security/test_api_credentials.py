"""Issue 12 item 5: a credential never reaches a log line or an error message, whatever a peer echoes back."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import pytest
import trustme

from adapter.api.authn import TOKENREVIEWS
from adapter.config.kube import KubeAPIConfig
from adapter.kube.client import KubeClient
from adapter.kube.errors import KubeAPIError, KubeConfigError
from adapter.redact import redact
from tests.fixtures.kube_standin import KubeStandIn, Reply, StandInRequest, status_body
from tests.security.api_serving import connect, read_all, run, serving

TOKEN = "sekrit-bearer-0123456789"
LIST = "/apis/external.metrics.k8s.io/v1beta1/namespaces/default/demo-queue-depth"


def _echo_status(request: StandInRequest, _match: re.Match[str]) -> Reply:
    """What a broken webhook or proxy in front of the API server has been seen to do: quote the request."""
    quoted = request.body.decode()
    return Reply(400, status_body(400, "BadRequest", f"cannot review {quoted} (token {TOKEN} is malformed)"))


def _echo_text(request: StandInRequest, _match: re.Match[str]) -> Reply:
    return Reply(502, f"bad gateway for {request.headers} with body {request.body.decode()}")


@pytest.mark.parametrize("handler", [_echo_status, _echo_text])
async def test_an_error_that_echoes_the_request_carries_no_credential(handler: Any) -> None:
    with KubeStandIn() as kube:
        kube.add_route("POST", r"/apis/authentication\.k8s\.io/v1/tokenreviews", handler)
        client = KubeClient.from_config(kube.client_config())
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": TOKEN}}
        with pytest.raises(KubeAPIError) as caught:
            await client.request("POST", TOKENREVIEWS, body, secret=TOKEN)
        await client.close()
        text = str(caught.value)
        assert TOKEN not in text
        assert kube.token is not None
        assert kube.token not in text  # our own Authorization header, echoed
        assert "[redacted]" in text


def test_a_failed_token_review_logs_no_token(caplog: pytest.LogCaptureFixture) -> None:
    ca = trustme.CA()

    async def scenario() -> None:
        with KubeStandIn() as kube:
            kube.set_authentication_configmap(ca.cert_pem.bytes(), ["front-proxy-client"])
            kube.add_route("POST", r"/apis/authentication\.k8s\.io/v1/tokenreviews", _echo_status)
            auth = {"enabled": True, "kubernetes": kube.client_config()}
            async with serving({"auth": auth}) as ports:
                reader, writer = await connect(ports.api, tls=True)
                head = f"GET {LIST} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nConnection: close\r\n\r\n"
                writer.write(head.encode())
                answer = await read_all(reader)
                writer.close()
                assert answer.startswith(b"HTTP/1.1 401 ")

    with caplog.at_level(logging.DEBUG):
        run(scenario())
    assert "TokenReview failed" in caplog.text
    assert TOKEN not in caplog.text


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Authorization: Bearer abc.def", "Authorization: Bearer [redacted]"),
        ('{"spec":{"token":"t0k"}}', '{"spec":{"token":"[redacted]"}}'),
        ("GET /x?access_token=abc&b=1", "GET /x?access_token=[redacted]&b=1"),
        ("jwt eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln end", "jwt [redacted] end"),
        ("redis://h:6379/0?password=zz", "redis://h:6379/0?password=[redacted]"),
        ("https://admin:pw@k:6443/api", "https://admin:[redacted]@k:6443/api"),
        ("users: [{user: {token: abc123}}]", "users: [{user: {token: [redacted]}}]"),
        ("queue=orders,topic in (a,b)", "queue=orders,topic in (a,b)"),
    ],
)
def test_what_looks_like_a_credential_is_redacted(text: str, expected: str) -> None:
    assert redact(text) == expected


def test_a_kubeconfig_error_does_not_quote_its_token(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("users:\n- name: u\n  user: {token: sekrit-bearer-0123456789\n")  # unclosed flow mapping
    with pytest.raises(KubeConfigError) as refused:
        KubeClient.from_config(KubeAPIConfig(kubeconfig=kubeconfig))
    assert "cannot read the kubeconfig" in str(refused.value)
    assert TOKEN not in str(refused.value)


def test_the_access_log_carries_no_token_from_a_query(caplog: pytest.LogCaptureFixture) -> None:
    """Before: the DEBUG access log wrote the request target as it came, `?access_token=` included."""

    async def scenario() -> None:
        async with serving({}) as ports:
            reader, writer = await connect(ports.api, tls=True)
            writer.write(f"GET {LIST}?access_token={TOKEN} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
            assert (await read_all(reader)).startswith(b"HTTP/1.1 ")
            writer.close()

    with caplog.at_level(logging.DEBUG, "adapter.api.access"):
        run(scenario())
    assert "access_token=[redacted]" in caplog.text
    assert TOKEN not in caplog.text


def test_a_failing_access_review_logs_a_line_a_minute_not_one_per_request(caplog: pytest.LogCaptureFixture) -> None:
    """Before: with SubjectAccessReviews failing, every request logged a warning."""

    def broken(_request: StandInRequest, _match: re.Match[str]) -> Reply:
        return Reply(500, status_body(500, "InternalError", "etcd is down"))

    async def scenario() -> None:
        with KubeStandIn() as kube:
            kube.tokens[TOKEN] = {"username": "alice"}
            kube.add_route("POST", r"/apis/authorization\.k8s\.io/v1/subjectaccessreviews", broken)
            async with serving({"auth": {"enabled": True, "kubernetes": kube.client_config()}}) as ports:
                for _ in range(20):
                    reader, writer = await connect(ports.api, tls=True)
                    head = (
                        f"GET {LIST} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nConnection: close\r\n\r\n"
                    )
                    writer.write(head.encode())
                    assert (await read_all(reader)).startswith(b"HTTP/1.1 500 ")
                    writer.close()

    with caplog.at_level(logging.WARNING):
        run(scenario())
    assert caplog.text.count("SubjectAccessReview for") == 1
