"""Network links and their addresses, through pyroute2 (netlink)."""

from __future__ import annotations

import psutil

from host_runtime.common.readings import unavailable


def translate_links(links: list, addresses: list, speed_of) -> list[dict]:
    """pyroute2 link and address messages in our schema (pure but for `speed_of`)."""
    by_index: dict[int, list] = {}
    for a in addresses:
        by_index.setdefault(a["index"], []).append({
            "family": "ipv4" if a["family"] == 2 else "ipv6",
            "address": a.get_attr("IFA_ADDRESS"),
            "prefixlen": a["prefixlen"],
            "scope": {0: "global", 200: "site", 253: "link", 254: "host"}.get(a["scope"], str(a["scope"])),
        })
    out = []
    for link in links:
        name = link.get_attr("IFLA_IFNAME")
        info = link.get_attr("IFLA_LINKINFO")
        kind = info.get_attr("IFLA_INFO_KIND") if info else None
        out.append({
            "name": name,
            "index": link["index"],
            "mac": link.get_attr("IFLA_ADDRESS"),
            "state": (link.get_attr("IFLA_OPERSTATE") or "unknown").lower(),
            "mtu": link.get_attr("IFLA_MTU"),
            "kind": kind or ("loopback" if name == "lo" else "physical"),
            "speed_mbps": speed_of(name),
            "addresses": sorted(by_index.get(link["index"], []), key=lambda a: (a["family"], a["address"])),
        })
    return sorted(out, key=lambda link: link["name"])


def link_speeds() -> dict[str, int | dict]:
    """Link speeds as psutil reads them (0: the driver reports none: link down or virtual)."""
    return {name: s.speed if s.speed > 0 else unavailable("the driver reports no speed (link down or virtual)")
            for name, s in psutil.net_if_stats().items()}


def collect_network() -> list[dict] | dict:
    try:
        from pyroute2 import IPRoute

        speeds = link_speeds()
        with IPRoute() as ipr:
            return translate_links(ipr.get_links(), ipr.get_addr(),
                                   lambda name: speeds.get(name, unavailable("psutil does not list this link")))
    except Exception as exc:  # netlink errors come in several pyroute2 types
        return unavailable(f"netlink: {exc}")
