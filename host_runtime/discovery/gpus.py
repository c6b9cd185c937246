"""GPUs: every display-class PCI device (pyudev), joined by PCI address with what the GPU layer reads of it:
NVML (NVIDIA) and amdgpu (AMD) details, and the llama.cpp device that drives it."""

from __future__ import annotations

from pathlib import Path

from host_runtime.common.readings import unavailable
from host_runtime.common.pci import normalize_address, pci_link
from host_runtime.gpu import amdgpu, nvml

VENDORS = {"0x10de": "nvidia", "0x1002": "amd", "0x8086": "intel", "0x1a03": "aspeed", "0x102b": "matrox"}


def display_devices() -> list[dict] | dict:
    """Display-class (0x03xxxx) PCI devices from udev/sysfs, working driver or not."""
    try:
        import pyudev

        context = pyudev.Context()
        devices = []
        for dev in context.list_devices(subsystem="pci"):
            klass = dev.attributes.get("class")
            klass = klass.decode() if isinstance(klass, bytes) else klass
            if not klass or not klass.startswith("0x03"):
                continue
            vendor = dev.attributes.get("vendor")
            vendor = vendor.decode().strip() if isinstance(vendor, bytes) else vendor
            devices.append({"pci_address": dev.sys_name, "vendor": VENDORS.get(vendor, vendor),
                            "vendor_id": vendor, "class": klass, "driver": dev.driver})
        return devices
    except ImportError as exc:
        return unavailable(f"pyudev cannot load libudev: {exc}")
    except Exception as exc:  # pyudev raises several types for a broken udev/sysfs
        return unavailable(f"udev enumeration failed: {exc}")


def llama_devices() -> list[dict] | dict:
    """The GPUs as the installed llama.cpp sees them (its device names, free memory): what the planner reads."""
    try:
        from host_runtime.gpu.llama_devices import LlamaDevicesError, list_devices
    except ImportError as exc:
        return unavailable(f"the GPU layer cannot be loaded: {exc}")
    try:
        return [d.to_json() for d in list_devices()]
    except LlamaDevicesError as exc:
        return unavailable(str(exc))


def collect_gpus(sys_root: Path = Path("/sys")) -> dict:
    display = display_devices()
    nv_raw, nv_status = nvml.snapshot()
    amd_raw, amd_status = amdgpu.snapshot(sys_root)
    details = {g["pci_address"]: g for g in [nvml.translate(r) for r in nv_raw] + [amdgpu.translate(r) for r in amd_raw]
               if isinstance(g["pci_address"], str)}
    llama = llama_devices()
    by_address = {normalize_address(d["pci_address"]): d["name"] for d in (llama if isinstance(llama, list) else [])
                  if d.get("pci_address")}
    devices = []
    listed = display if isinstance(display, list) else []
    for dev in listed:
        entry = {**dev, "pcie": pci_link(dev["pci_address"], sys_root)}
        if dev["pci_address"] in by_address:
            entry["llama_device"] = by_address[dev["pci_address"]]
        elif dev["vendor"] in ("nvidia", "amd", "intel"):
            entry["llama_device"] = unavailable(_why_not_driven(dev, llama))
        detail = details.pop(dev["pci_address"], None)
        if detail:
            entry["details"] = detail
        elif dev["vendor"] in ("nvidia", "amd"):
            entry["details"] = unavailable("the vendor library does not see this card: no working driver?")
        devices.append(entry)
    for address, detail in details.items():  # seen by a vendor library but not by udev
        devices.append({"pci_address": address, "vendor": "nvidia" if detail["backend"] == "nvml" else "amd",
                        "driver": None, "class": None, "vendor_id": None, "pcie": pci_link(address, sys_root),
                        "details": detail})
    udev = display if not isinstance(display, list) else {"available": True}
    return {"devices": devices, "llama_devices": llama,
            "sources": {"udev": udev, "nvml": nv_status, "amdgpu": amd_status}}


def _why_not_driven(dev: dict, llama) -> str:
    """Why llama.cpp does not serve from a card udev lists: the owner sees this, never silence."""
    if not isinstance(llama, list):
        return f"llama.cpp's devices cannot be read: {llama.get('unavailable')}"
    if not dev.get("driver"):
        return "no kernel driver is bound to it (missing firmware or driver package?)"
    return (f"the {dev['driver']} driver runs it, but no llama.cpp backend lists it (a Vulkan ICD or the "
            "CUDA driver library may be missing, or the card reports no PCI bus id)")
