"""What counts as this LAN, said once: the address ranges a LAN (or a tailnet) uses, and the host names only a
LAN gives. The local CA vouches for these ranges alone (front/tls.py), and a tracing collector may be reached in
clear only there (serving/settings.py)."""

from __future__ import annotations

import ipaddress

# Private, CGNAT (tailnets), loopback and unique-local ranges. Not link-local: the front's certificate never names
# a link-local address (front/tls.addresses_now leaves them out), and clouds keep their metadata service there.
LAN_NETWORKS = tuple(ipaddress.ip_network(n) for n in (
    "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "127.0.0.0/8", "fc00::/7", "::1/128"))
LAN_SUFFIXES = (".local", ".lan", ".internal", ".home.arpa")  # names no public DNS gives


def lan_address(ip) -> bool:
    """Whether an address is in one of the LAN's ranges."""
    ip = ipaddress.ip_address(ip)
    return any(ip in net for net in LAN_NETWORKS if net.version == ip.version)


def on_the_lan(host: str) -> bool:
    """Whether a URL's host names a machine on this LAN: an address in its ranges, a one-label name, or a name under
    a suffix only LANs use."""
    try:
        return lan_address(host)
    except ValueError:
        name = host.lower().rstrip(".")
        return "." not in name or name.endswith(LAN_SUFFIXES)
