"""Which format a metrics page is rendered in, from the scraper's `Accept` header (adapter/telemetry/exposition.py);
the two endpoints that serve it: tests/proxy/test_admin.py, tests/api/test_metrics_page.py."""

from __future__ import annotations

import pytest

from adapter.telemetry.exposition import CLASSIC, OPENMETRICS, negotiate
from tests.fixtures.openmetrics import PROMETHEUS_ACCEPT, family_names


@pytest.mark.parametrize(
    "accept",
    [
        PROMETHEUS_ACCEPT,
        "application/openmetrics-text",
        "APPLICATION/OpenMetrics-Text ; Version=1.0.0",
        "text/plain;q=0.5, application/openmetrics-text;q=0.1",
        "application/openmetrics-text;q=abc",  # a malformed weight is ignored
        "application/openmetrics-text;version=2.0.0;escaping=allow-utf-8",  # still our one OpenMetrics page
        "," * 8000 + "application/openmetrics-text",
    ],
)
def test_openmetrics_when_the_header_names_it(accept: str) -> None:
    assert negotiate(accept) is OPENMETRICS


@pytest.mark.parametrize(
    "accept",
    [
        None,
        "",
        "text/plain;version=0.0.4",
        "*/*",
        "application/openmetrics-text;q=0",  # "not acceptable"
        "application/openmetrics-text;q=0.000",
        "application/openmetrics-textile",
        "application/json, text/html;q=0.9",
        ";;;,,,==;q=;version=",
        "\xff\xfe\x00 application/openmetrics",
        "text/plain;" + "q=1;" * 3000,
    ],
)
def test_the_classic_format_otherwise(accept: str | None) -> None:
    assert negotiate(accept) is CLASSIC


def test_the_two_pages_differ_as_their_formats_do() -> None:
    openmetrics = OPENMETRICS.render().decode()
    assert openmetrics.endswith("# EOF\n")
    assert family_names(openmetrics) >= {"process_cpu_seconds"}
    assert "# EOF" not in CLASSIC.render().decode()
    assert OPENMETRICS.content_type.startswith("application/openmetrics-text; version=1.0.0")
    assert CLASSIC.content_type.startswith("text/plain")
