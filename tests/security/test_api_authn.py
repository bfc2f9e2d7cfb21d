"""Reviews under attack: a flood of made-up tokens, or of made-up namespaces and metrics from an authenticated
caller, is bounded (429 past it), shared per key, and cannot evict the answers real callers are cached under."""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Coroutine
from typing import Any

import pytest
import trustme

from tests.fixtures.kube_standin import KubeStandIn, Reply, StandInRequest
from tests.security.api_serving import connect, insecure_client, read_all, run, serving

LIST = "/apis/external.metrics.k8s.io/v1beta1/namespaces/default/demo-queue-depth"
GOOD = "good-token-0123456789"


TOKENREVIEWS = r"/apis/authentication\.k8s\.io/v1/tokenreviews"
ACCESSREVIEWS = r"/apis/authorization\.k8s\.io/v1/subjectaccessreviews"


class HeldReviews:
    """One of the stand-in's review routes, held until released, counting how many are in flight at once."""

    def __init__(self, kube: KubeStandIn, route: str = TOKENREVIEWS) -> None:
        self._lock = threading.Lock()
        self._answer = kube._token_review if route == TOKENREVIEWS else kube._access_review
        self.release = threading.Event()
        self.in_flight = 0
        self.most = 0
        self.seen: list[dict[str, Any]] = []
        kube.add_route("POST", route, self)

    def __call__(self, request: StandInRequest, match: re.Match[str]) -> Reply:
        with self._lock:
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)
            self.seen.append(request.json()["spec"])
        try:
            self.release.wait(20)
            return self._answer(request, match)
        finally:
            with self._lock:
                self.in_flight -= 1

    def tokens(self) -> list[str]:
        return [spec["token"] for spec in self.seen]


async def _get(port: int, token: str, path: str = LIST) -> bytes:
    reader, writer = await connect(port, tls=True)
    head = f"GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"
    writer.write(head.encode())
    answer = await read_all(reader, 30)
    writer.close()
    return answer.split(b" ", 2)[1]


async def _flood(
    held: HeldReviews, requests: list[Coroutine[Any, Any, bytes]], bound: int
) -> tuple[list[bytes], list[bytes]]:
    """Send the requests at once while the reviews are held: the answers given before the release (all but
    `bound` of them are due then, or this fails after 30 s), then every answer."""
    flood = [asyncio.create_task(request) for request in requests]
    pending = set(flood)
    while len(flood) - len(pending) < len(flood) - bound:
        done, pending = await asyncio.wait(pending, timeout=30, return_when=asyncio.FIRST_COMPLETED)
        assert done, "requests past the bound are answered at once, not queued behind the reviews"
    early = [task.result() for task in flood if task.done()]
    held.release.set()
    return early, list(await asyncio.gather(*flood))


def _auth(kube: KubeStandIn, **extra: Any) -> dict[str, Any]:
    return {"auth": {"enabled": True, "kubernetes": kube.client_config(), **extra}}


def test_token_reviews_in_flight_are_bounded_and_the_rest_are_429(caplog: pytest.LogCaptureFixture) -> None:
    """Before: every bogus token started its own TokenReview at once (40 of 40 in flight here)."""

    async def scenario() -> None:
        with KubeStandIn() as kube:
            held = HeldReviews(kube)
            async with serving(_auth(kube, max_token_reviews=4)) as ports:
                early, codes = await _flood(held, [_get(ports.api, f"bogus-{n}") for n in range(40)], 4)
                assert held.most <= 4
                assert set(early) == {b"429"}
                assert set(codes) == {b"401", b"429"}

    run(scenario())
    assert caplog.text.count("raise server.auth.max_token_reviews if they are legitimate") == 1  # a line a minute


def test_callers_with_the_same_token_share_one_review() -> None:
    async def scenario() -> None:
        with KubeStandIn() as kube:
            kube.tokens[GOOD] = {"username": "alice", "groups": ["team"]}
            held = HeldReviews(kube)
            async with serving(_auth(kube)) as ports:
                callers = [asyncio.create_task(_get(ports.api, GOOD)) for _ in range(10)]
                await asyncio.sleep(1.0)
                held.release.set()
                assert await asyncio.gather(*callers) == [b"200"] * 10
                assert held.tokens() == [GOOD]

    run(scenario())


def test_a_flood_of_bogus_tokens_does_not_evict_an_accepted_one() -> None:
    """Before: accepted and refused tokens shared one cache, so 20 bogus tokens pushed out a real one."""

    async def scenario() -> None:
        with KubeStandIn() as kube:
            kube.tokens[GOOD] = {"username": "alice"}
            held = HeldReviews(kube)
            held.release.set()
            async with serving(_auth(kube, cache_size=4, token_cache_ttl=60)) as ports:
                assert await _get(ports.api, GOOD) == b"200"
                for n in range(20):
                    assert await _get(ports.api, f"bogus-{n}") == b"401"
                assert await _get(ports.api, GOOD) == b"200"
                assert held.tokens().count(GOOD) == 1

    run(scenario())


def test_an_authenticated_review_without_a_username_is_refused() -> None:
    async def scenario() -> None:
        with KubeStandIn() as kube:
            kube.tokens[GOOD] = {"username": "", "groups": ["system:masters"]}
            async with serving(_auth(kube)) as ports:
                assert await _get(ports.api, GOOD) == b"401"

    run(scenario())


def _metric(name: str) -> str:
    return f"/apis/external.metrics.k8s.io/v1beta1/namespaces/default/{name}"


def test_access_reviews_in_flight_are_bounded_and_the_rest_are_429() -> None:
    """Before: any authenticated caller (any service account's token) started one SubjectAccessReview per
    made-up metric name at once, with no bound (40 of 40 in flight here)."""

    async def scenario() -> None:
        with KubeStandIn() as kube:
            kube.tokens[GOOD] = {"username": "system:serviceaccount:web:default"}
            held = HeldReviews(kube, ACCESSREVIEWS)
            async with serving(_auth(kube, max_access_reviews=4)) as ports:
                flood = [_get(ports.api, GOOD, _metric(f"made-up-{n}")) for n in range(40)]
                early, codes = await _flood(held, flood, 4)
                assert held.most <= 4
                assert set(early) == {b"429"}
                assert b"429" in codes

    run(scenario())


def test_a_flood_of_denials_does_not_evict_a_cached_allow() -> None:
    """Before: allows and denials shared one cache, so 20 denied made-up requests pushed out the HPA's allow."""

    async def scenario() -> None:
        with KubeStandIn() as kube:
            kube.tokens[GOOD] = {"username": "hpa"}
            kube.tokens["other"] = {"username": "mallory"}
            kube.authorize = lambda spec: "allow" if spec["user"] == "hpa" else "deny"
            held = HeldReviews(kube, ACCESSREVIEWS)
            held.release.set()
            async with serving(_auth(kube, cache_size=4, allow_cache_ttl=60, deny_cache_ttl=60)) as ports:
                assert await _get(ports.api, GOOD) == b"200"
                for n in range(20):
                    assert await _get(ports.api, "other", _metric(f"made-up-{n}")) == b"403"
                assert await _get(ports.api, GOOD) == b"200"
                assert [spec["user"] for spec in held.seen].count("hpa") == 1

    run(scenario())


@pytest.mark.parametrize("name", ["m" * 254, "a%2Fb", "a%25b", "%2E%2E", "a%00b"])
def test_a_metric_name_that_cannot_be_costs_no_review(name: str) -> None:
    """Before: any metric name went to a SubjectAccessReview and keyed its cached answer: an authenticated
    caller could park 16 KB names, 10,000 per cache; now it is a 400 before any review, like a bad namespace."""

    async def scenario() -> None:
        with KubeStandIn() as kube:
            kube.tokens[GOOD] = {"username": "alice"}
            async with serving(_auth(kube)) as ports:
                assert await _get(ports.api, GOOD, _metric(name)) == b"400"
                assert await _get(ports.api, GOOD, _metric("m" * 253)) == b"404"  # the longest name is asked
                assert len(kube.access_reviews) == 1

    run(scenario())


def test_paths_we_do_not_serve_cost_no_review() -> None:
    """Before: every distinct unknown path was a SubjectAccessReview and a cache entry keyed by it (up to
    16 KB), and any authenticated user is allowed /apis/* by the system:discovery role."""

    async def scenario() -> None:
        with KubeStandIn() as kube:
            kube.tokens[GOOD] = {"username": "alice"}
            async with serving(_auth(kube)) as ports:
                for n in range(10):
                    assert await _get(ports.api, GOOD, f"/apis/made-up-{n}/" + "x" * 1000) == b"404"
                assert await _get(ports.api, "bogus", "/apis/made-up") == b"401"  # still authenticated first
                assert kube.access_reviews == []
                assert await _get(ports.api, GOOD, "/apis") == b"200"  # discovery is still reviewed
                assert len(kube.access_reviews) == 1

    run(scenario())


def test_spellings_of_one_request_share_one_access_review() -> None:
    """Before: the review's cache key held the path as spelled, so each percent-encoding of the same namespace
    and metric was a review and an entry of its own (unboundedly many spellings of one question)."""

    async def scenario() -> None:
        with KubeStandIn() as kube:
            kube.tokens[GOOD] = {"username": "alice"}
            async with serving(_auth(kube)) as ports:
                for spelling in ("default", "%64efault", "d%65fault", "de%66ault"):
                    path = f"/apis/external.metrics.k8s.io/v1beta1/namespaces/{spelling}/demo-queue-depth"
                    assert await _get(ports.api, GOOD, path) == b"200"
                assert len(kube.access_reviews) == 1

    run(scenario())


def test_front_proxy_headers_with_empty_values_add_nothing() -> None:
    """Before: an empty `X-Remote-Extra-*` value became an extra of "" in the SubjectAccessReview (empty
    groups were already dropped); the generic apiserver drops both."""
    ca = trustme.CA()
    proxy_cert = ca.issue_cert(common_name="front-proxy-client")

    async def scenario() -> None:
        with KubeStandIn() as kube:
            kube.set_authentication_configmap(ca.cert_pem.bytes(), ["front-proxy-client"])
            async with serving(_auth(kube)) as ports:
                client = insecure_client()
                proxy_cert.configure_cert(client)
                reader, writer = await asyncio.open_connection("127.0.0.1", ports.api, ssl=client)
                headers = "X-Remote-User: hpa\r\nX-Remote-Group:\r\nX-Remote-Group: g\r\nX-Remote-Extra-Scope:  \r\n"
                writer.write(f"GET {LIST} HTTP/1.1\r\nHost: x\r\n{headers}Connection: close\r\n\r\n".encode())
                assert (await read_all(reader)).startswith(b"HTTP/1.1 200 ")
                writer.close()
                (review,) = kube.access_reviews
                assert review["spec"]["groups"] == ["g", "system:authenticated"]
                assert review["spec"]["extra"] == {}

    run(scenario())


def test_one_callers_review_flood_leaves_room_for_another_caller() -> None:
    """Before: one authenticated caller asking about made-up metrics took every review slot, and the HPA,
    whose cached allows expire every few seconds, was answered 429."""

    async def scenario() -> None:
        with KubeStandIn() as kube:
            kube.tokens[GOOD] = {"username": "hpa"}
            kube.tokens["other"] = {"username": "mallory"}
            held = HeldReviews(kube, ACCESSREVIEWS)
            async with serving(_auth(kube, max_access_reviews=8)) as ports:
                flood = [_get(ports.api, "other", _metric(f"made-up-{n}")) for n in range(20)]
                early, codes = await _flood(held, [*flood, _get(ports.api, GOOD)], 2 + 1)
                assert early.count(b"429") == 18  # mallory: her share (a quarter of 8) in flight, the rest 429
                assert codes[-1] == b"200"
                assert [spec["user"] for spec in held.seen].count("hpa") == 1

    run(scenario())
