"""The API's SERVER spans for what is not a value read: discovery, and a caller's error (which is not ours).
Reads down to the source: tests/sources/redis/test_tracing.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.trace import StatusCode

from adapter.telemetry import tracing
from tests.api.fixtures import StartServer
from tests.fixtures.httpclient import fetch
from tests.fixtures.traces import Traces, attributes

VERSION = "/apis/external.metrics.k8s.io/v1beta1"


@pytest.fixture
def traces() -> Iterator[Traces]:
    with Traces() as traces:
        yield traces


async def test_discovery_has_its_path_as_route_and_a_callers_error_is_not_the_servers(
    start_server: StartServer, traces: Traces
) -> None:
    server = await start_server({"auth": {"enabled": False}})
    assert (await fetch(server.port, VERSION + "/")).status == 200
    assert (await fetch(server.port, f"{VERSION}/namespaces/default/nope?labelSelector=a%3Db")).status == 404

    discovery, missing = traces.ended()
    assert attributes(discovery) == {
        tracing.METHOD: "GET",
        tracing.HTTP_ROUTE: VERSION,
        tracing.STATUS_CODE: 200,
    }
    assert attributes(missing) == {
        tracing.METHOD: "GET",
        tracing.HTTP_ROUTE: VERSION + "/namespaces/{namespace}/{metric}",
        tracing.STATUS_CODE: 404,
        tracing.METRIC: "nope",
        tracing.NAMESPACE: "default",
        tracing.SELECTOR: "a=b",
    }
    assert missing.status.status_code is StatusCode.UNSET  # a 4xx is the caller's (OpenTelemetry's HTTP rule)
