"""GPUs: every display-class PCI device (pyudev), with NVML (NVIDIA) and amdgpu (AMD) details where they work."""

from __future__ import annotations

from pathlib import Path

from host_runtime.discovery.fields import is_unavailable, read_int, unavailable
from host_runtime.discovery.pci import normalize_address, pci_link

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


# ---- NVIDIA: NVML wrapped so that an unsupported query reads as unavailable, nvitop-style ----

def _nvml(call, *args):
    import pynvml

    try:
        value = call(*args)
    except pynvml.NVMLError as exc:
        return unavailable(f"NVML: {exc}")
    return value.decode() if isinstance(value, bytes) else value


def nvml_snapshot() -> tuple[list[dict], dict]:
    """One raw dict per NVIDIA GPU, straight from NVML, and the source's status."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except ImportError:
        return [], unavailable("nvidia-ml-py is not installed")
    except Exception as exc:
        return [], unavailable(str(exc))
    try:
        raw = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = _nvml(pynvml.nvmlDeviceGetMemoryInfo, h)
            pci = _nvml(pynvml.nvmlDeviceGetPciInfo, h)
            raw.append({
                "index": i, "name": _nvml(pynvml.nvmlDeviceGetName, h), "uuid": _nvml(pynvml.nvmlDeviceGetUUID, h),
                "pci_bus_id": pci if is_unavailable(pci) else (pci.busId.decode() if isinstance(pci.busId, bytes) else pci.busId),
                "memory_total": mem if is_unavailable(mem) else mem.total,
                "memory_free": mem if is_unavailable(mem) else mem.free,
                "compute_capability": _nvml(pynvml.nvmlDeviceGetCudaComputeCapability, h),
                "power_limit_constraints": _nvml(pynvml.nvmlDeviceGetPowerManagementLimitConstraints, h),
                "power_limit_default": _nvml(pynvml.nvmlDeviceGetPowerManagementDefaultLimit, h),
                "power_limit": _nvml(pynvml.nvmlDeviceGetPowerManagementLimit, h),
                "temp_slowdown": _nvml(pynvml.nvmlDeviceGetTemperatureThreshold, h,
                                       pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN),
                "temp_shutdown": _nvml(pynvml.nvmlDeviceGetTemperatureThreshold, h,
                                       pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN),
                "nvlink_peers": _nvlink_peers(pynvml, h),
            })
        status = {"available": True, "driver_version": _nvml(pynvml.nvmlSystemGetDriverVersion),
                  "cuda_driver_version": _nvml(pynvml.nvmlSystemGetCudaDriverVersion)}
        return raw, status
    finally:
        pynvml.nvmlShutdown()


def _nvlink_peers(pynvml, handle) -> list[str] | dict:
    """PCI addresses of the cards at the other end of each active NVLink; unavailable if the card has none."""
    peers = []
    for link in range(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18)):
        state = _nvml(pynvml.nvmlDeviceGetNvLinkState, handle, link)
        if is_unavailable(state):
            # NVML answers "not supported" past the card's last link, or at link 0 on cards without NVLink.
            return state if link == 0 else peers
        if state:
            remote = _nvml(pynvml.nvmlDeviceGetNvLinkRemotePciInfo, handle, link)
            if not is_unavailable(remote):
                bus = remote.busId.decode() if isinstance(remote.busId, bytes) else remote.busId
                peers.append(normalize_address(bus))
    return peers


def _milliwatts_to_watts(value):
    return value if is_unavailable(value) else round(value / 1000.0, 3)


def translate_nvml(raw: dict) -> dict:
    """NVML's raw values in our schema (pure: tested with values recorded from real cards)."""
    limits = raw["power_limit_constraints"]
    cc = raw["compute_capability"]
    bus = raw["pci_bus_id"]
    return {
        "backend": "nvml", "index": raw["index"], "name": raw["name"], "uuid": raw["uuid"],
        "pci_address": bus if is_unavailable(bus) else normalize_address(bus),
        "vram_total_bytes": raw["memory_total"], "vram_free_bytes": raw["memory_free"],
        "compute_capability": cc if is_unavailable(cc) else f"{cc[0]}.{cc[1]}",
        "power_limit_w": {
            "min": limits if is_unavailable(limits) else _milliwatts_to_watts(limits[0]),
            "max": limits if is_unavailable(limits) else _milliwatts_to_watts(limits[1]),
            "default": _milliwatts_to_watts(raw["power_limit_default"]),
            "current": _milliwatts_to_watts(raw["power_limit"]),
        },
        "temperature_thresholds_c": {"slowdown": raw["temp_slowdown"], "shutdown": raw["temp_shutdown"]},
        "nvlink_peers": raw["nvlink_peers"],
    }


# ---- AMD: pyamdgpuinfo, power cap from the amdgpu hwmon files ----

def amd_snapshot(sys_root: Path = Path("/sys")) -> tuple[list[dict], dict]:
    try:
        import pyamdgpuinfo

        count = pyamdgpuinfo.detect_gpus()
    except ImportError:
        return [], unavailable("pyamdgpuinfo is not installed")
    except Exception as exc:  # it raises FileNotFoundError when /dev/dri is absent, RuntimeError otherwise
        return [], unavailable(str(exc))
    raw = []
    for i in range(count):
        gpu = pyamdgpuinfo.get_gpu(i)
        raw.append({"index": i, "name": getattr(gpu, "name", None), "pci_slot": gpu.pci_slot,
                    "memory_info": dict(gpu.memory_info), "hwmon": amd_power_cap(gpu.pci_slot, sys_root)})
    return raw, {"available": True}


def amd_power_cap(pci_slot: str, sys_root: Path = Path("/sys")) -> dict:
    hwmons = sorted((sys_root / "bus/pci/devices" / pci_slot / "hwmon").glob("hwmon*"))
    if not hwmons:
        return unavailable("no amdgpu hwmon directory")
    h = hwmons[0]
    return {k: read_int(h / f"power1_cap{suffix}") for k, suffix in
            (("current", ""), ("max", "_max"), ("min", "_min"), ("default", "_default"))}


def translate_amd(raw: dict) -> dict:
    """pyamdgpuinfo's values in our schema (pure). Power caps in hwmon are microwatts."""
    hw = raw["hwmon"]

    def watts(v):
        return v if is_unavailable(v) else round(v / 1e6, 3)

    return {
        "backend": "amdgpu", "index": raw["index"], "name": raw["name"] or unavailable("libdrm gave no name"),
        "pci_address": normalize_address(raw["pci_slot"]),
        "vram_total_bytes": raw["memory_info"].get("vram_size", unavailable("no vram_size")),
        "power_limit_w": hw if is_unavailable(hw) else {k: watts(v) for k, v in hw.items()},
    }


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
    nv_raw, nv_status = nvml_snapshot()
    amd_raw, amd_status = amd_snapshot(sys_root)
    details = {g["pci_address"]: g for g in [translate_nvml(r) for r in nv_raw] + [translate_amd(r) for r in amd_raw]
               if isinstance(g["pci_address"], str)}
    devices = []
    listed = display if isinstance(display, list) else []
    for dev in listed:
        entry = {**dev, "pcie": pci_link(dev["pci_address"], sys_root)}
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
    return {"devices": devices, "llama_devices": llama_devices(), "sources": {"udev": display if not isinstance(display, list) else {"available": True},
                                            "nvml": nv_status, "amdgpu": amd_status}}
