"""Network links and their addresses, through pyroute2 (netlink)."""

from __future__ import annotations

from pathlib import Path

from host_runtime.discovery.fields import read_int, unavailable


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


def link_speed(name: str, sys_root: Path = Path("/sys")) -> int | dict:
    speed = read_int(sys_root / "class/net" / name / "speed")
    if isinstance(speed, int) and speed < 0:
        return unavailable("the driver reports no speed (link down or virtual)")
    return speed


def collect_network() -> list[dict] | dict:
    try:
        from pyroute2 import IPRoute

        with IPRoute() as ipr:
            return translate_links(ipr.get_links(), ipr.get_addr(), link_speed)
    except Exception as exc:  # netlink errors come in several pyroute2 types
        return unavailable(f"netlink: {exc}")
