"""`delegate:`: unknown metric names forwarded to another external metrics API server.

The delegate here is a second, real Zeroscale `serve()` over HTTPS with other metrics (and one colliding
name), its certificate from its own trustme CA; both servers ask the same Kubernetes stand-in, so the
order of the reviews shows who asked for whom. Delegates that misbehave at the connection level (silent,
oversized) are raw TLS listeners, named as STAND-INs where they are made.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pydantic
import pytest
import trustme

from adapter.api.delegate import Delegate, DiscoveryError, _list_problem
from adapter.children import port_outside_ephemeral
from adapter.config import ZeroscaleConfig
from adapter.config.delegate import DelegateConfig
from adapter.telemetry import tracing
from tests.fixtures.adapter_inprocess import DEMO_METRICS, DEMO_SOURCES, start_serving
from tests.fixtures.httpclient import Answer, fetch
from tests.fixtures.kube_standin import KubeStandIn
from tests.fixtures.traces import Traces, attributes

VERSION = "/apis/external.metrics.k8s.io/v1beta1"
OURS = f"{VERSION}/namespaces/team-a/demo-queue-depth"
THEIRS = f"{VERSION}/namespaces/team-a/s0-redis-jobs"
ZEROSCALE_SA = "system:serviceaccount:zeroscale:zeroscale-adapter"
# The delegate serves one name of its own and one that collides with ours.
DELEGATE_SOURCES: list[dict[str, Any]] = [
    {"name": "other", "type": "static", "series": [{"labels": {}, "value": 7}]},
]
DELEGATE_METRICS: list[dict[str, Any]] = [
    {"name": "s0-redis-jobs", "type": "static", "source": "other"},
    {"name": "demo-queue-depth", "type": "static", "source": "other"},
]


@dataclass
class Servers:
    front: int
    delegate: int
    delegate_ca: Path
    token_file: Path


@pytest.fixture
async def start(kube: KubeStandIn) -> AsyncIterator[Callable[..., Awaitable[tuple[int, asyncio.Event]]]]:
    """Start a `serve()` with a server section, metrics and an optional delegate; stopped after the test."""
    running: list[tuple[asyncio.Event, asyncio.Task[int]]] = []

    async def run(
        server: dict[str, Any],
        metrics: list[dict[str, Any]],
        sources: list[dict[str, Any]],
        delegate: dict[str, Any] | None = None,
        port: int = 0,
    ) -> tuple[int, asyncio.Event]:
        settings = {"bind": "127.0.0.1", "metrics_bind": "127.0.0.1", "port": port, "metrics_port": 0}
        config = ZeroscaleConfig(server={**settings, **server}, sources=sources, metrics=metrics, delegate=delegate)
        serving = await start_serving(config, "a server")
        running.append((serving.stop, serving.task))
        return serving.ports["api"], serving.stop

    yield run
    for stop, task in running:
        stop.set()
        await asyncio.wait_for(task, 10)


def _auth(kube: KubeStandIn) -> dict[str, Any]:
    return {"enabled": True, "kubernetes": kube.client_config()}


@pytest.fixture
def delegate_ca() -> trustme.CA:
    return trustme.CA(organization_name="delegate-ca")


def _delegate_tls(ca: trustme.CA, directory: Path) -> tuple[dict[str, Any], Path]:
    """Serving files for the delegate, and its CA's file for the front."""
    leaf = ca.issue_cert("127.0.0.1", "localhost")
    cert, key, ca_file = directory / "tls.crt", directory / "tls.key", directory / "ca.crt"
    leaf.cert_chain_pems[0].write_to_path(str(cert))
    leaf.private_key_pem.write_to_path(str(key))
    ca.cert_pem.write_to_path(str(ca_file))
    return {"cert_file": str(cert), "key_file": str(key)}, ca_file


@pytest.fixture
async def servers(
    start: Callable[..., Awaitable[tuple[int, asyncio.Event]]],
    kube: KubeStandIn,
    front_proxy_ca: trustme.CA,
    client_ca: trustme.CA,
    delegate_ca: trustme.CA,
    tmp_path: Path,
) -> Servers:
    """The delegate (auth on), then Zeroscale in front of it (auth on), both asking the stand-in."""
    kube.set_authentication_configmap(
        front_proxy_ca.cert_pem.bytes(), ["front-proxy-client"], client_ca.cert_pem.bytes()
    )
    kube.tokens["alice-token"] = {"username": "alice", "groups": ["team-a"]}
    kube.tokens["zeroscale-sa-token"] = {"username": ZEROSCALE_SA, "groups": ["system:serviceaccounts"]}
    tls, ca_file = _delegate_tls(delegate_ca, tmp_path)
    delegate_port, _ = await start({"tls": tls, "auth": _auth(kube)}, DELEGATE_METRICS, DELEGATE_SOURCES)
    token_file = tmp_path / "token"
    token_file.write_text("zeroscale-sa-token\n")
    delegate = {
        "url": f"https://127.0.0.1:{delegate_port}",
        "ca_file": str(ca_file),
        "token_file": str(token_file),
        "discovery_refresh": 0.2,
        "timeout": 2.0,
    }
    front_port, _ = await start({"auth": _auth(kube)}, DEMO_METRICS, DEMO_SOURCES, delegate)
    return Servers(front_port, delegate_port, ca_file, token_file)


async def _get(port: int, path: str, token: str = "alice-token") -> Answer:
    return await fetch(port, path, [("Authorization", f"Bearer {token}")])


async def _eventually(attempt: Callable[[], Awaitable[bool]], seconds: float = 10.0) -> None:
    for _ in range(int(seconds / 0.05)):
        if await attempt():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("condition not met in time")


def _resource_reviews(kube: KubeStandIn) -> list[tuple[str, str]]:
    reviews = [review["spec"] for review in kube.access_reviews if "resourceAttributes" in review["spec"]]
    return [(spec["user"], spec["resourceAttributes"]["resource"]) for spec in reviews]


def _names(answer: Answer) -> list[str]:
    return [resource["name"] for resource in answer.json()["resources"]]


async def test_unknown_names_go_to_the_delegate_as_zeroscale_after_our_review(
    servers: Servers, kube: KubeStandIn
) -> None:
    answer = await _get(servers.front, THEIRS)
    assert answer.status == 200, answer.body
    item = answer.json()["items"][0]
    assert (item["metricName"], item["value"]) == ("s0-redis-jobs", "7")
    # Ours for the caller first, then the delegate's own for Zeroscale's identity, never the caller's
    # (the delegate's discovery, fetched in the background, makes non-resource reviews: left out).
    assert _resource_reviews(kube) == [("alice", "s0-redis-jobs"), (ZEROSCALE_SA, "s0-redis-jobs")]
    assert {review["spec"]["token"] for review in kube.token_reviews} == {"alice-token", "zeroscale-sa-token"}


async def test_a_forwarded_read_is_traced_as_delegated(servers: Servers) -> None:
    with Traces() as traces:
        assert (await _get(servers.front, THEIRS)).status == 200
        spans = traces.ended()
    delegated = [span for span in spans if attributes(span).get(tracing.CACHE_OUTCOME) == "delegated"]
    assert [attributes(span)[tracing.METRIC] for span in delegated] == ["s0-redis-jobs"]


async def test_our_names_win_a_collision_and_never_reach_the_delegate(servers: Servers, kube: KubeStandIn) -> None:
    answer = await _get(servers.front, OURS + "?labelSelector=queue%3Dorders")
    assert answer.status == 200, answer.body
    assert answer.json()["items"][0]["value"] == "1500"  # ours; the delegate's would be 7
    assert _resource_reviews(kube) == [("alice", "demo-queue-depth")]


async def test_a_caller_we_refuse_never_reaches_the_delegate(servers: Servers, kube: KubeStandIn) -> None:
    kube.authorize = lambda spec: "deny" if spec["user"] == "alice" else "allow"
    answer = await _get(servers.front, THEIRS)
    assert answer.status == 403
    assert _resource_reviews(kube) == [("alice", "s0-redis-jobs")]


async def test_discovery_is_the_union_and_a_collision_is_named_at_start(
    servers: Servers, caplog: pytest.LogCaptureFixture
) -> None:
    async def union() -> bool:
        return _names(await _get(servers.front, VERSION)) == ["demo-queue-depth", "s0-redis-jobs"]

    with caplog.at_level(logging.WARNING, logger="adapter.api.delegate"):
        await _eventually(union)
    warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert any("demo-queue-depth" in message and "delegate" in message for message in warnings), warnings


async def test_delegate_down_answers_503_naming_it_and_ours_keep_answering(
    start: Callable[..., Awaitable[tuple[int, asyncio.Event]]],
    kube: KubeStandIn,
    delegate_ca: trustme.CA,
    tmp_path: Path,
) -> None:
    kube.tokens["alice-token"] = {"username": "alice", "groups": []}
    tls, ca_file = _delegate_tls(delegate_ca, tmp_path)
    delegate_port = port_outside_ephemeral()  # restarted on it below: no outgoing connection may take it meanwhile
    off = {"enabled": False}
    token_file = tmp_path / "token"
    token_file.write_text("t")
    url = f"https://127.0.0.1:{delegate_port}"
    delegate = {"url": url, "ca_file": str(ca_file), "token_file": str(token_file), "discovery_refresh": 0.2}
    _, stop_delegate = await start({"tls": tls, "auth": off}, DELEGATE_METRICS, DELEGATE_SOURCES, port=delegate_port)
    front, _ = await start({"auth": off}, DEMO_METRICS, DEMO_SOURCES, delegate)

    async def union() -> bool:
        return "s0-redis-jobs" in _names(await fetch(front, VERSION))

    await _eventually(union)
    stop_delegate.set()
    await asyncio.sleep(0.5)  # the delegate's listener closes, and a discovery fails meanwhile
    down = await fetch(front, THEIRS)
    assert down.status == 503, down.body
    assert url in down.json()["message"]
    assert down.json()["code"] == 503
    assert (await fetch(front, OURS)).status == 200
    # Discovery keeps the delegate's last good list while it is down.
    assert _names(await fetch(front, VERSION)) == ["demo-queue-depth", "s0-redis-jobs"]
    await start({"tls": tls, "auth": off}, DELEGATE_METRICS, DELEGATE_SOURCES, port=delegate_port)

    async def back() -> bool:
        return (await fetch(front, THEIRS)).status == 200

    await _eventually(back)


async def test_a_delegate_that_lists_nothing_is_an_error_not_an_empty_list(
    start: Callable[..., Awaitable[tuple[int, asyncio.Event]]], delegate_ca: trustme.CA, tmp_path: Path
) -> None:
    tls, ca_file = _delegate_tls(delegate_ca, tmp_path)
    port, _ = await start({"tls": tls, "auth": {"enabled": False}}, [], [])
    token_file = tmp_path / "token"
    token_file.write_text("t")
    config = DelegateConfig(url=f"https://127.0.0.1:{port}", ca_file=ca_file, token_file=token_file)
    delegate = Delegate(config, ["demo-queue-depth"])
    try:
        with pytest.raises(DiscoveryError, match="lists no metric"):
            await delegate.refresh()
        assert delegate.names() == ()
    finally:
        await delegate.close()


async def test_a_delegate_with_another_ca_is_not_trusted(
    start: Callable[..., Awaitable[tuple[int, asyncio.Event]]], delegate_ca: trustme.CA, tmp_path: Path
) -> None:
    tls, _ = _delegate_tls(delegate_ca, tmp_path)
    port, _ = await start({"tls": tls, "auth": {"enabled": False}}, DELEGATE_METRICS, DELEGATE_SOURCES)
    other = tmp_path / "other-ca.crt"
    trustme.CA().cert_pem.write_to_path(str(other))
    token_file = tmp_path / "token"
    token_file.write_text("t")
    delegate = Delegate(DelegateConfig(url=f"https://127.0.0.1:{port}", ca_file=other, token_file=token_file), [])
    try:
        with pytest.raises(DiscoveryError, match=r"CERTIFICATE_VERIFY_FAILED|certificate verify failed"):
            await delegate.refresh()
        answer = await delegate.list("team-a", "s0-redis-jobs", "")
        assert answer.status == 503
    finally:
        await delegate.close()


@contextlib.asynccontextmanager
async def _raw_delegate(
    ca: trustme.CA, answer: Callable[[asyncio.StreamWriter], Awaitable[None]], heads: list[bytes] | None = None
) -> AsyncIterator[int]:
    """A STAND-IN delegate at the connection level: TLS with a good certificate, then `answer` writes what it likes
    (the request heads it read are added to `heads`)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception):
            head = await reader.readuntil(b"\r\n\r\n")
            if heads is not None:
                heads.append(head)
            await answer(writer)
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=context)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()


def _raw_config(port: int, ca: trustme.CA, tmp_path: Path, **settings: Any) -> DelegateConfig:
    ca_file, token_file = tmp_path / "raw-ca.crt", tmp_path / "token"
    ca.cert_pem.write_to_path(str(ca_file))
    token_file.write_text("t")
    return DelegateConfig(url=f"https://127.0.0.1:{port}", ca_file=ca_file, token_file=token_file, **settings)


async def test_a_silent_delegate_gets_its_deadline(delegate_ca: trustme.CA, tmp_path: Path) -> None:
    async def silent(writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{")  # then nothing, forever
        await asyncio.sleep(60)

    async with _raw_delegate(delegate_ca, silent) as port:
        delegate = Delegate(_raw_config(port, delegate_ca, tmp_path, timeout=0.5), [])
        try:
            answer = await asyncio.wait_for(delegate.list("team-a", "s0-redis-jobs", ""), 5)
            assert answer.status == 503
            message = json.loads(answer.body)["message"]
            assert "within 0.5s" in message, message
            assert "delegate.timeout" in message, message
        finally:
            await delegate.close()


async def test_an_oversized_answer_is_cut_off(delegate_ca: trustme.CA, tmp_path: Path) -> None:
    async def flood(writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for _ in range(100):
            writer.write(b"1000\r\n" + b" " * 4096 + b"\r\n")
            await writer.drain()

    async with _raw_delegate(delegate_ca, flood) as port:
        delegate = Delegate(_raw_config(port, delegate_ca, tmp_path, max_response_bytes=65_536), [])
        try:
            answer = await delegate.list("team-a", "s0-redis-jobs", "")
            assert answer.status == 502
            assert "delegate.max_response_bytes" in json.loads(answer.body)["message"]
        finally:
            await delegate.close()


@pytest.mark.parametrize(
    ("settings", "problem"),
    [
        ({}, "exactly one of delegate.service or delegate.url"),
        ({"url": "https://a:443", "service": {"namespace": "keda", "name": "m"}}, "exactly one"),
        ({"url": "http://a:80"}, "must be https"),
        ({"url": "https://a/apis/x"}, "must be https"),
        ({"url": "https://user:pw@a"}, "must not hold a credential"),
    ],
)
def test_delegate_settings_are_checked(settings: dict[str, Any], problem: str) -> None:
    with pytest.raises(pydantic.ValidationError, match=problem):
        DelegateConfig.model_validate(settings)


def test_a_service_delegate_is_called_at_its_cluster_name() -> None:
    config = DelegateConfig.model_validate(
        {"service": {"namespace": "keda", "name": "keda-operator-metrics-apiserver"}}
    )
    assert config.address() == ("keda-operator-metrics-apiserver.keda.svc", 443)


def _list_answer(items: list[Any]) -> bytes:
    body = json.dumps(
        {
            "kind": "ExternalMetricValueList",
            "apiVersion": "external.metrics.k8s.io/v1beta1",
            "metadata": {},
            "items": items,
        },
        allow_nan=True,
    ).encode()
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)


def _item(name: str, value: Any) -> dict[str, Any]:
    return {"metricName": name, "metricLabels": {}, "timestamp": "2026-01-01T00:00:00Z", "value": value}


async def test_the_delegate_is_asked_for_the_name_we_reviewed(
    start: Callable[..., Awaitable[tuple[int, asyncio.Event]]],
    kube: KubeStandIn,
    delegate_ca: trustme.CA,
    tmp_path: Path,
) -> None:
    """The review checks the lower-cased name (as client-go sends it); the delegate must get that name, not the
    caller's spelling: `S0-Secret` reviewed as `s0-secret` would otherwise reach a case-sensitive delegate's
    `S0-Secret`, a name the caller was never checked for."""
    kube.tokens["alice-token"] = {"username": "alice", "groups": []}
    heads: list[bytes] = []

    async def answer(writer: asyncio.StreamWriter) -> None:
        writer.write(_list_answer([_item("s0-secret", "1")]))

    async with _raw_delegate(delegate_ca, answer, heads) as delegate_port:
        config = _raw_config(delegate_port, delegate_ca, tmp_path).model_dump(mode="json", exclude_none=True)
        front, _ = await start({"auth": _auth(kube)}, DEMO_METRICS, DEMO_SOURCES, config)
        answer_ = await _get(front, f"{VERSION}/namespaces/team-a/S0-Secret")
        assert answer_.status == 200, answer_.body
    assert _resource_reviews(kube) == [("alice", "s0-secret")]
    asked = [head.split(b" ")[1] for head in heads if b"/namespaces/" in head]
    assert asked == [f"{VERSION}/namespaces/team-a/s0-secret".encode()]


def _redirect() -> bytes:
    body = _list_answer([_item("s0-redis-jobs", "1")]).partition(b"\r\n\r\n")[2]
    return b"HTTP/1.1 302 Found\r\nLocation: https://elsewhere/\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        (_list_answer([_item("s0-redis-jobs", float("nan"))]), "not a Quantity string"),
        (_list_answer([_item("s0-redis-jobs", "NaN")]), "not a Quantity"),
        (_list_answer([_item("s0-redis-jobs", "1e30")]), "too large"),
        (_list_answer([_item("s0-redis-jobs", "1e400000")]), "not a Quantity"),
        (_list_answer([_item("s0-redis-jobs", "1"), _item("s0-other", "5")]), "for metric 's0-other'"),
        (_list_answer(["1"]), "without a metricName"),
        (_list_answer([{**_item("s0-redis-jobs", "1"), "metricLabels": {"a": 1}}]), "metricLabels"),
        (_redirect(), "302 without an ExternalMetricValueList"),
    ],
)
async def test_a_delegate_answer_that_would_be_a_wrong_number_is_a_502(
    delegate_ca: trustme.CA, tmp_path: Path, raw: bytes, problem: str
) -> None:
    """The HPA sums what it gets: a NaN (which Python's JSON decoder takes, and would write back as invalid
    JSON), an overflowing value, another metric's item or a redirect's body must not reach it as a reading."""

    async def answer(writer: asyncio.StreamWriter) -> None:
        writer.write(raw)

    async with _raw_delegate(delegate_ca, answer) as port:
        delegate = Delegate(_raw_config(port, delegate_ca, tmp_path), [])
        try:
            answered = await delegate.list("team-a", "s0-redis-jobs", "")
        finally:
            await delegate.close()
    assert answered.status == 502, answered.body
    message = json.loads(answered.body)["message"]
    assert problem in message, message
    assert "delegate" in message, message


async def test_one_callers_slow_calls_leave_the_delegate_to_the_others(delegate_ca: trustme.CA, tmp_path: Path) -> None:
    """A caller (any user allowed one delegate metric) that keeps `max_in_flight` slow calls open took every
    slot: the HPA controller's calls then waited out `delegate.timeout` and were answered 503. One caller
    holds at most a quarter of the slots; past it, that caller alone is answered 429 at once."""
    release = asyncio.Event()

    async def answer(writer: asyncio.StreamWriter) -> None:
        if b"/s0-slow" in heads[-1]:
            await release.wait()  # the flood's calls hang until the test ends
        writer.write(_list_answer([_item(heads[-1].split(b" ")[1].rsplit(b"/", 1)[1].decode(), "1")]))

    heads: list[bytes] = []
    async with _raw_delegate(delegate_ca, answer, heads) as port:
        delegate = Delegate(_raw_config(port, delegate_ca, tmp_path, max_in_flight=4, timeout=2.0), [])
        try:
            flood = [asyncio.create_task(delegate.list("team-a", "s0-slow", "", "mallory")) for _ in range(4)]
            await _eventually(lambda: _true(any(b"/s0-slow" in head for head in heads)))
            answered = await delegate.list("team-a", "s0-jobs", "", "system:kube-controller-manager")
            assert answered.status == 200, answered.body
            # Answered while the flood's own call still hangs (not once its deadline freed the slots).
            assert sum(not task.done() for task in flood) == 1
            refused = [task.result() for task in flood if task.done()]
            assert [answer.status for answer in refused] == [429, 429, 429]
            assert "delegate.max_in_flight" in json.loads(refused[0].body)["message"]
        finally:
            release.set()
            await asyncio.gather(*flood, return_exceptions=True)
            await delegate.close()


async def _true(value: bool) -> bool:
    return value


async def test_the_delegate_refusing_our_identity_is_no_verdict_on_the_caller(
    servers: Servers, kube: KubeStandIn
) -> None:
    """The caller was authorized by us; a 403 from the delegate is about Zeroscale's own identity there. Passed
    on as a 403, the caller (the HPA controller) read it as a refusal of its own credentials."""
    kube.authorize = lambda spec: "deny" if spec["user"] == ZEROSCALE_SA else "allow"
    answer = await _get(servers.front, THEIRS)
    assert answer.status == 502, answer.body
    assert "delegate.token_file" in answer.json()["message"]


async def test_names_no_caller_could_ask_are_not_listed(delegate_ca: trustme.CA, tmp_path: Path) -> None:
    listed = ["s0-jobs", "x" * 300, "bad%name", "..", "jobs/status"]

    async def answer(writer: asyncio.StreamWriter) -> None:
        resources = [{"name": name, "kind": "ExternalMetricValueList", "verbs": ["get"]} for name in listed]
        body = json.dumps({"kind": "APIResourceList", "groupVersion": "x", "resources": resources}).encode()
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))

    async with _raw_delegate(delegate_ca, answer) as port:
        delegate = Delegate(_raw_config(port, delegate_ca, tmp_path), [])
        try:
            await delegate.refresh()
        finally:
            await delegate.close()
    assert delegate.names() == ("s0-jobs",)


def test_items_whose_labels_go_wrote_as_null_are_a_list_not_a_problem() -> None:
    """KEDA's metrics server (Go) writes an item's nil `metricLabels` map as null: that is no labels, not a 502."""
    item: dict[str, Any] = {"metricName": "s0-redis-jobs", "metricLabels": None, "value": "3", "timestamp": "x"}
    document: dict[str, Any] = {"kind": "ExternalMetricValueList", "items": [item]}
    assert _list_problem(200, document, "s0-redis-jobs") is None
    item["metricLabels"] = {"a": 1}
    assert _list_problem(200, document, "s0-redis-jobs") == "item 0 with metricLabels that are not strings"
