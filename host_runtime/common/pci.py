"""PCIe placement from sysfs: link speed and width (current and max), NUMA node, bridge path."""

from __future__ import annotations

import re
from pathlib import Path

from host_runtime.common.readings import read_int, read_text, unavailable

PCI_ADDRESS = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


def normalize_address(address: str) -> str:
    """NVML says 00000000:01:00.0, sysfs says 0000:01:00.0: compare in sysfs's form."""
    address = address.lower()
    domain, _, rest = address.partition(":")
    return f"{int(domain, 16):04x}:{rest}" if rest else address


def bridge_path(resolved: Path) -> list[str]:
    """PCI addresses between the root complex and the device, outermost first (pure on the path)."""
    parts = [p for p in resolved.parts if PCI_ADDRESS.match(p)]
    return parts[:-1]


def pci_link(address: str, sys_root: Path = Path("/sys")) -> dict:
    dev = sys_root / "bus/pci/devices" / address
    if not dev.exists():
        return {"address": address, "error": unavailable(f"{dev} does not exist")}
    try:
        path = bridge_path(dev.resolve())
    except OSError as exc:
        path = unavailable(f"cannot resolve {dev}: {exc.strerror}")
    numa = read_int(dev / "numa_node")
    return {
        "address": address,
        "current_link_speed": read_text(dev / "current_link_speed"),
        "max_link_speed": read_text(dev / "max_link_speed"),
        "current_link_width": read_int(dev / "current_link_width"),
        "max_link_width": read_int(dev / "max_link_width"),
        "numa_node": numa if not isinstance(numa, int) or numa >= 0 else None,  # -1: no NUMA affinity
        "bridge_path": path,
    }
