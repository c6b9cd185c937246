"""Which hosts a pull asked for through the API may reach (#56, item 4). The serving user's downloads could reach
anything the box can: the BMC agent and the router on loopback, a cloud's metadata service, LAN devices through
a redirect; the answers said what was there. A pull through the API goes to an http(s) host that is not loopback,
link-local, a metadata address, unspecified or multicast, unless the owner names it in serving.toml's
pull_hosts; where pull_hosts is given, to those hosts alone. Every redirect is judged by the same rule before it
is followed, and the address actually connected to after (a name that resolves differently the second time).

The owner's own `everycycle models pull` is not judged: root may fetch from anywhere it can reach."""

from __future__ import annotations

import ipaddress
import socket
import urllib.parse
from dataclasses import dataclass

from host_runtime.models.errors import SourceRefused

# Cloud metadata services beyond the link-local range: AWS's IPv6 one, and Alibaba's.
METADATA = (ipaddress.ip_network("fd00:ec2::254/128"), ipaddress.ip_network("100.100.100.200/32"))
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def _closed(address: Address) -> str | None:
    """Why a pull may not reach `address` unless it is named; None where it may."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if address.is_loopback:
        return "a loopback address (this box's own services)"
    if address.is_link_local:
        return "a link-local address (where clouds keep their metadata service)"
    if any(address in net for net in METADATA):
        return "a cloud metadata address"
    if address.is_unspecified or address.is_multicast or address.is_reserved:
        return "an address no download goes to"
    return None


@dataclass(frozen=True)
class PullHosts:
    """pull_hosts: host names, addresses or networks (10.0.0.0/24). Empty: any host but the closed ones."""

    named: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for entry in self.named:
            check_entry(entry)

    def _names(self, host: str, address: Address | None) -> bool:
        for entry in self.named:
            if entry.lower() == host.lower():
                return True
            if address is not None:
                try:
                    if address in ipaddress.ip_network(entry, strict=False):
                        return True
                except ValueError:
                    continue
        return False

    def check_url(self, url: str, resolve=socket.getaddrinfo) -> None:
        """SourceRefused unless `url` may be fetched: its scheme, its host, and every address the host resolves
        to. A name that does not resolve is left to the connection to report."""
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname or ""
        if parts.scheme not in ("http", "https") or not host:
            raise SourceRefused(f"{url}: a pull through the API fetches http(s) URLs only")
        try:
            addresses = [ipaddress.ip_address(host)]
        except ValueError:
            try:
                addresses = sorted({ipaddress.ip_address(info[4][0].split("%")[0])
                                    for info in resolve(host, parts.port or 443, type=socket.SOCK_STREAM)},
                                   key=str)
            except (OSError, UnicodeError, ValueError):
                addresses = []
        if not addresses and self.named and not self._names(host, None):
            raise SourceRefused(self._not_named(host))
        for address in addresses:
            self.check_address(host, address)

    def check_address(self, host: str, address: Address | str) -> None:
        """SourceRefused unless `address` (what `host` resolved to, or what the connection reached) may be used."""
        address = ipaddress.ip_address(str(address).split("%")[0])
        if self.named:
            if not self._names(host, address):
                raise SourceRefused(self._not_named(f"{host} ({address})" if str(address) != host else host))
            return
        why = _closed(address)
        if why is not None:
            shown = f"{host} ({address})" if str(address) != host else host
            raise SourceRefused(f"{shown} is {why}, which a pull through the API may not reach; the owner names it "
                                "in serving.toml's pull_hosts to allow it, or pulls with 'everycycle models pull'")

    def _not_named(self, host: str) -> str:
        return (f"{host} is not among the hosts serving.toml's pull_hosts allows ({', '.join(self.named)}); "
                "the owner adds it there, or pulls with 'everycycle models pull'")


def check_entry(entry: str) -> None:
    """A pull_hosts entry: a host name, an address or a network; ValueError naming what is wrong."""
    if not isinstance(entry, str) or not entry or any(c in entry for c in " /:@?#") and not _network(entry):
        raise ValueError(f"{entry!r} is neither a host name, an address nor a network (10.0.0.0/24)")


def _network(entry: str) -> bool:
    try:
        ipaddress.ip_network(entry, strict=False)
        return True
    except ValueError:
        return False
