"""The API server's rule for an endpoint address (adapter/k8s_wire/endpoint_ip.py)."""

from __future__ import annotations

import pytest

from adapter.k8s_wire.endpoint_ip import LOOPBACK, NOT_AN_IP, endpoint_refusal


@pytest.mark.parametrize(
    ("address", "refusal"),
    [
        ("10.1.0.7", None),
        ("192.0.2.10", None),
        ("fd00::7", None),
        ("2001:db8::1", None),
        ("127.0.0.1", LOOPBACK),
        ("127.3.4.5", LOOPBACK),
        ("::1", LOOPBACK),
        ("::ffff:127.0.0.1", LOOPBACK),  # IPv4-mapped: judged as the IPv4 address, as Go's net.ParseIP reads it
        ("0.0.0.0", "unspecified"),
        ("::", "unspecified"),
        ("169.254.169.254", "link_local"),  # a cloud's metadata service
        ("::ffff:169.254.169.254", "link_local"),
        ("fe80::1", "link_local"),
        ("224.0.0.251", "link_local"),
        ("ff02::1", "link_local"),
        ("localhost", NOT_AN_IP),
        ("web.default.svc.cluster.local", NOT_AN_IP),
        ("", NOT_AN_IP),
    ],
)
def test_the_api_servers_rule(address: str, refusal: str | None) -> None:
    assert endpoint_refusal(address) == refusal
