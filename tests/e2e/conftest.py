"""Session fixtures of the end-to-end tests: the real control plane, Redis, Kafka and `zeroscale serve`.

These tests run only under `make e2e` (scripts/e2e.sh sets ZEROSCALE_E2E=1): the control plane (scripts/k8s) listens
on a fixed port (ZS_K8S_PORT, 16443) and takes the whole machine's attention, so `make test` skips them.
The control plane is brought up once (unless it already runs) and brought down after the session, whatever
happens; each scenario prints its timeline in the summary at the end.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from adapter.children import port_outside_ephemeral
from tests.e2e import install
from tests.e2e.cluster import HPA_API, ControlPlane, Kube
from tests.e2e.dataplane import DataPlane
from tests.e2e.fixtures import _TIMELINES, Adapter, BrokerStart, Installed, Timeline, kube_api
from tests.e2e.processes import Zeroscale
from tests.fixtures.kafka_broker import KafkaBroker
from tests.fixtures.redis_servers import RedisProcess

HERE = Path(__file__).parent
ENABLED = os.environ.get("ZEROSCALE_E2E") == "1"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "e2e: needs the real control plane (`make e2e`)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip = pytest.mark.skip(reason="end-to-end: run `make e2e` (ZEROSCALE_E2E=1)")
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.e2e)
            if not ENABLED:
                item.add_marker(skip)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _TIMELINES:
        return
    terminalreporter.section("end-to-end timelines")
    for line in _TIMELINES:
        terminalreporter.write_line(line)
    out = os.environ.get("ZEROSCALE_E2E_TIMELINES")
    if out:
        Path(out).write_text("\n".join(_TIMELINES) + "\n", encoding="utf-8")


@pytest.fixture(scope="session")
def timeline() -> Timeline:
    return Timeline()


@pytest.fixture(scope="session")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("e2e")


@pytest.fixture(scope="session")
def kafka_starting(workdir: Path) -> Iterator[BrokerStart]:
    starting = BrokerStart(workdir)
    yield starting
    starting.stop()


@pytest.fixture(scope="session")
def kafka_broker(kafka_starting: BrokerStart) -> KafkaBroker:
    return kafka_starting.wait()


@pytest.fixture(scope="session")
def plane(kafka_starting: BrokerStart) -> Iterator[ControlPlane]:
    control_plane = ControlPlane()
    try:
        control_plane.up()
        yield control_plane
    finally:
        control_plane.down()


@pytest.fixture(scope="session")
def kube(plane: ControlPlane) -> Kube:
    return Kube(plane)


@pytest.fixture(scope="session")
def dataplane(plane: ControlPlane, kube: Kube, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DataPlane]:
    """kube-proxy in a network namespace of the session's own (tests/e2e/dataplane.py), or the test is skipped."""
    why = DataPlane.unavailable()
    if why is not None:
        pytest.skip(f"no real data plane here: {why}")
    with DataPlane(plane, kube, tmp_path_factory.mktemp("dataplane")) as dataplane:
        yield dataplane


@pytest.fixture(autouse=True)
def no_hpa_outlives_its_scenario(request: pytest.FixtureRequest) -> Iterator[None]:
    """Each scenario's HPAs are deleted after it: one left polling would meet the next scenario's breakages
    (and its answers would be read as that scenario's)."""
    yield
    if "kube" not in request.fixturenames:
        return
    kube: Kube = request.getfixturevalue("kube")
    for hpa in kube.get(f"/apis/{HPA_API}/horizontalpodautoscalers")["items"]:
        meta = hpa["metadata"]
        kube.delete(f"/apis/{HPA_API}/namespaces/{meta['namespace']}/horizontalpodautoscalers/{meta['name']}")


@pytest.fixture(scope="session")
def redis_server(workdir: Path) -> Iterator[RedisProcess]:
    server = RedisProcess(workdir, []).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def installed(kube: Kube, workdir: Path) -> Installed:
    install.install_rbac(kube)
    certs = install.make_certs(workdir / "certs")
    return Installed(
        certs,
        install.token_file(kube, "zeroscale-adapter", workdir),
        install.token_file(kube, "zeroscale-proxy", workdir),
    )


@pytest.fixture(scope="session")
def counts_port() -> int:
    """Where the proxy serves its pending counts and the adapter's http source subscribes."""
    return port_outside_ephemeral()


@pytest.fixture(scope="session")
def adapter(
    plane: ControlPlane,
    kube: Kube,
    installed: Installed,
    workdir: Path,
    redis_server: RedisProcess,
    kafka_starting: BrokerStart,
    counts_port: int,
) -> Iterator[Adapter]:
    """`zeroscale serve` registered as the cluster's external metrics API, Available=True.

    No request-header CA is configured: the adapter reads it, and the allowed names, from the cluster's
    extension-apiserver-authentication ConfigMap.
    """
    port, metrics_port = port_outside_ephemeral(), port_outside_ephemeral()
    name_label = {"pattern": "[a-z0-9][-a-z0-9.]*", "required": True}
    config = {
        "server": {
            "bind": "127.0.0.1",
            "port": port,
            "metrics_bind": "127.0.0.1",
            "metrics_port": metrics_port,
            "tls": {"cert_file": str(installed.certs / "tls.crt"), "key_file": str(installed.certs / "tls.key")},
            "auth": {"kubernetes": kube_api(plane, installed.adapter_token)},
        },
        "cache": {"interval": 0.5, "max_staleness": 10},
        "sources": [
            {"name": "redis", "type": "redis", "url": f"redis://{redis_server.address}"},
            {
                "name": "kafka",
                "type": "kafka",
                "bootstrap_servers": [kafka_starting.broker.bootstrap],
                "metadata_max_age": 0.5,
                "offsets_max_age": 0.5,
            },
            {"name": "proxies", "type": "http", "proxies": [f"127.0.0.1:{counts_port}"]},
        ],
        "metrics": [
            {
                "name": "redis-jobs",
                "type": "redis",
                "source": "redis",
                "query": "length",
                "labels": {"key": name_label},
            },
            {
                "name": "kafka-lag",
                "type": "kafka",
                "source": "kafka",
                "lag_threshold": 10,
                "labels": {"group": name_label, "topic": {"pattern": "[a-z0-9][-a-z0-9.]*"}},
            },
            {"name": "http-pending", "type": "http", "source": "proxies"},
        ],
    }
    (workdir / "adapter").mkdir()
    # DEBUG: the access log of every request the aggregator and the HPA controller send (test_07 reads it).
    server = Zeroscale("serve", workdir / "adapter", config, port, log_level="DEBUG").start()
    try:
        # A fresh registration, so Available is the aggregator's verdict on this adapter, not an old one.
        kube.delete(install.APISERVICE_PATH)
        install.register(kube, port, installed.certs)
        yield Adapter(server, port, metrics_port, install.wait_available(kube))
    finally:
        server.stop()
