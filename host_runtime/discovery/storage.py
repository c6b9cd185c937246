"""Block devices: model, size, rotational, transport, mount points and free space, NVMe PCIe links."""

from __future__ import annotations

from pathlib import Path

import psutil

from host_runtime.common.readings import is_unavailable, read_int, read_text, unavailable
from host_runtime.common.pci import PCI_ADDRESS, pci_link

SKIP_PREFIXES = ("loop", "ram", "zram", "dm-", "md", "sr", "fd", "nbd")


def collect_storage(sys_root: Path = Path("/sys")) -> list[dict] | dict:
    block = sys_root / "block"
    if not block.is_dir():
        return unavailable(f"{block} does not exist")
    try:
        partitions = psutil.disk_partitions(all=False)
    except OSError:
        partitions = []  # mounts then read as "not mounted"; the disks are still listed
    disks = []
    for dev in sorted(block.iterdir()):
        name = dev.name
        if name.startswith(SKIP_PREFIXES):
            continue
        parts = {name} | {p.name for p in dev.iterdir() if p.name.startswith(name)}
        mounts = []
        for p in partitions:
            if Path(p.device).name in parts:
                try:
                    usage = psutil.disk_usage(p.mountpoint)
                    free = usage.free
                except OSError as exc:
                    free = unavailable(f"statvfs {p.mountpoint}: {exc.strerror}")
                mounts.append({"device": p.device, "mountpoint": p.mountpoint, "fstype": p.fstype, "free_bytes": free})
        sectors = read_int(dev / "size")
        model = read_text(dev / "device/model")
        entry = {
            "name": name,
            "model": model.strip() if isinstance(model, str) else model,
            "size_bytes": sectors if is_unavailable(sectors) else sectors * 512,
            "rotational": _bool(read_int(dev / "queue/rotational")),
            "transport": "nvme" if name.startswith("nvme") else ("virtio" if name.startswith("vd") else "other"),
            "mounts": mounts,
        }
        if name.startswith("nvme"):
            entry["pcie"] = _nvme_pci(dev, sys_root)
        disks.append(entry)
    return disks


def _bool(value):
    return value if is_unavailable(value) else bool(value)


def _nvme_pci(dev: Path, sys_root: Path) -> dict:
    try:
        resolved = (dev / "device").resolve()
    except OSError as exc:
        return unavailable(f"cannot resolve {dev}/device: {exc.strerror}")
    addresses = [p for p in resolved.parts if PCI_ADDRESS.match(p)]
    return pci_link(addresses[-1], sys_root) if addresses else unavailable("the controller is not on PCI")
