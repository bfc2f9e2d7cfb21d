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
        # Go's IsLinkLocalMulticast: ff<flags>2::/16, any flags (ff12: a transient group's, ff32: a prefix-based one's)
        ("ff12::1", "link_local"),
        ("ff32::1", "link_local"),
        ("ff05::1", None),  # site-local scope: the API takes it
        # A zone (scope id) is no part of an IP address to Go's net.ParseIP, nor to the API
        ("fe80::1%eth0", NOT_AN_IP),
        ("fd00::7%eth0", NOT_AN_IP),
        ("0127.0.0.1", NOT_AN_IP),  # leading zeros: octal to inet_aton, decimal to Go's ParseIPSloppy
        ("localhost", NOT_AN_IP),
        ("web.default.svc.cluster.local", NOT_AN_IP),
        ("", NOT_AN_IP),
    ],
)
def test_the_api_servers_rule(address: str, refusal: str | None) -> None:
    assert endpoint_refusal(address) == refusal
