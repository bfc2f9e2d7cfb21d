"""Fixtures of the telemetry tests: a real Jaeger v2 (tests/fixtures/jaeger.py) once per module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fixtures.jaeger import Jaeger, build_jaeger


@pytest.fixture(scope="module")
def jaeger(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Jaeger]:
    running = Jaeger(build_jaeger(), tmp_path_factory.mktemp("jaeger")).start()
    try:
        yield running
    finally:
        running.stop()
