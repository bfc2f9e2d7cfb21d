"""Which addresses may be a Service's endpoint: the API server's own rule for an EndpointSlice address
(ValidateEndpointIP in k8s.io/kubernetes pkg/apis/discovery/validation), which the proxy applies to every endpoint
whatever it came from (docs/architecture.md#only-ip-endpoints).

The API refuses, in IPv4 and IPv6 slices, an address that is unspecified (0.0.0.0, ::: dialled, it reaches this
host), loopback (127/8, ::1), link-local (169.254/16, fe80::/10: a cloud's metadata service lives there) or
link-local multicast; an IPv4-mapped IPv6 address is judged as the IPv4 one (Go's net.ParseIP reads it so).
A name is no IP at all: an FQDN slice's addresses, which kube-proxy does not route either.
"""

from __future__ import annotations

import ipaddress

NOT_AN_IP = "not_an_ip"
LOOPBACK = "loopback"


def endpoint_refusal(address: str) -> str | None:
    """Why `address` may not be an endpoint (NOT_AN_IP, "unspecified", LOOPBACK, "link_local"), None if it may."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return NOT_AN_IP
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.scope_id is not None:  # `fe80::1%eth0`: Python reads a zone, Go's net.ParseIP (and so the API) does not
            return NOT_AN_IP
        if ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
    if ip.is_unspecified:
        return "unspecified"
    if ip.is_loopback:
        return LOOPBACK
    if ip.is_link_local or _link_local_multicast(ip):
        return "link_local"
    return None


def _link_local_multicast(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Go's IP.IsLinkLocalMulticast: 224.0.0.0/24, and IPv6 multicast of link scope whatever its flags (ff02::,
    ff12::, ff32::: the scope is the second byte's low nibble)."""
    if ip.version == 4:
        return ip in _V4_LINK_LOCAL_MULTICAST
    packed = ip.packed
    return packed[0] == 0xFF and packed[1] & 0x0F == 0x02


_V4_LINK_LOCAL_MULTICAST = ipaddress.ip_network("224.0.0.0/24")
