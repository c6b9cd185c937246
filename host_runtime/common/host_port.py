"""HOST:PORT as the services' listen settings write it (an IP address, IPv6 in brackets, and a TCP port):
one parser for `serve --also-listen` and serving.toml's fleet_listen."""

from __future__ import annotations

import ipaddress


def split_host_port(text: str) -> tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]:
    """(address, port); ValueError saying what is wrong."""
    host, sep, port = text.rpartition(":")
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        raise ValueError(f"{text!r} is not IP:PORT") from None
    if not sep or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"{text!r}: {port!r} is not a TCP port")
    return address, int(port)
