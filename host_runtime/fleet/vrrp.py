"""Two gateways, one address (pure): keepalived's configuration for the fleet's virtual address.

Both gateways run the router and its controller all the time, fed by the same polls, so the standby serves the
moment the address reaches it. keepalived (VRRP version 2) holds the address on the gateway of higher priority;
it moves when that gateway's box stops advertising (the box is down or its link is cut: after three missed
adverts, about 3.6 s at one advert a second) or when its own check fails (its front or its router stopped: the
box gives the address up at once, advertising priority 0). Both start as BACKUP with `nopreempt`, so a gateway
that comes back stays the standby instead of taking the address back and cutting streams a second time.

The check is two TCP connects (bash's /dev/tcp, no interpreter start each second): the front's HTTPS port and the
router's loopback port.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from host_runtime.common.errors import EveryCycleError
from host_runtime.fleet.settings import FleetSettings

ADVERT_INTERVAL_S = 1
CHECK_INTERVAL_S = 1
CHECK_FALL = 2          # two failed checks (about 2 s) before the address is given up
INSTANCE = "everycycle_gateway"


class FailoverError(EveryCycleError):
    """The virtual address cannot be held here (no interface on its network, and none named)."""


@dataclass(frozen=True)
class Failover:
    """What keepalived needs beside fleet.toml: the interface, the front's port, where its files go."""

    interface: str
    front_port: int
    script_user: str = "nobody"


def interface_for(settings: FleetSettings, links: list[dict]) -> str:
    """The interface that carries the virtual address: vrrp_interface, or the one with an address on the virtual
    address's network (links as discovery's network source lists them)."""
    if settings.vrrp_interface:
        return settings.vrrp_interface
    vip = ipaddress.ip_interface(settings.virtual_address)
    network = vip.network
    # The box's own address on that network; the virtual address itself, held here already, does not count.
    found = sorted({link["name"] for link in links for a in link.get("addresses", [])
                    if a.get("family") == "ipv4" and a.get("address") != str(vip.ip)
                    and _in(a.get("address", ""), network)})
    if not found:
        raise FailoverError(f"no interface has an address on {network} (virtual_address "
                            f"{settings.virtual_address}): name one with vrrp_interface")
    if len(found) > 1:
        raise FailoverError(f"several interfaces are on {network} ({', '.join(found)}): name one with vrrp_interface")
    return found[0]


def _in(address: str, network) -> bool:
    try:
        return ipaddress.ip_address(address) in network
    except ValueError:
        return False


def check_command(front_port: int, router_port: int) -> str:
    return (f"/bin/bash -c '</dev/tcp/127.0.0.1/{front_port} && </dev/tcp/127.0.0.1/{router_port}'")


def render(settings: FleetSettings, failover: Failover) -> str:
    """keepalived.conf for this gateway."""
    vip = ipaddress.ip_interface(settings.virtual_address)
    lines = [
        "# Written by `everycycle fleet address` from fleet.toml at every start: edits here are overwritten.",
        "global_defs {",
        f"    router_id everycycle_{settings.vrrp_router_id}",
        f"    script_user {failover.script_user}",
        "    enable_script_security",
        "    vrrp_garp_master_refresh 10  # gratuitous ARP again every 10 s while master: switches forget",
        "}",
        "vrrp_script gateway_alive {",
        f"    script \"{check_command(failover.front_port, settings.router_port)}\"",
        f"    interval {CHECK_INTERVAL_S}",
        "    timeout 1",
        f"    fall {CHECK_FALL}",
        "    rise 2",
        "}",
        f"vrrp_instance {INSTANCE} {{",
        "    state BACKUP",
        "    nopreempt",
        f"    interface {failover.interface}",
        f"    virtual_router_id {settings.vrrp_router_id}",
        f"    priority {settings.vrrp_priority}",
        f"    advert_int {ADVERT_INTERVAL_S}",
    ]
    if settings.vrrp_peers:
        lines += ["    unicast_peer {", *(f"        {peer}" for peer in settings.vrrp_peers), "    }"]
    lines += [
        "    virtual_ipaddress {",
        f"        {vip.with_prefixlen} dev {failover.interface}",
        "    }",
        "    track_script {",
        "        gateway_alive",
        "    }",
        "}",
    ]
    return "\n".join(lines) + "\n"
