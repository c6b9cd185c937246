"""NVIDIA cards through NVML (pynvml): the one reader that discovery and the governor share.

Each card is named by its PCI address in sysfs's form (0000:65:00.0), the identity every part of the box
uses. A reading NVML does not support is {"unavailable": reason} (nvitop-style), never an exception;
NVML's own errors on opening become NvmlUnavailable.
"""

from __future__ import annotations

from host_runtime.common.errors import UnavailableError
from host_runtime.common.readings import is_unavailable, unavailable
from host_runtime.common.pci import normalize_address

# NVML clock-event ("throttle") reason bits that mean the hardware is protecting itself.
NVML_HW_SLOWDOWN = 0x8
NVML_SW_THERMAL_SLOWDOWN = 0x20
NVML_HW_THERMAL_SLOWDOWN = 0x40
NVML_HW_POWER_BRAKE_SLOWDOWN = 0x80


class NvmlUnavailable(UnavailableError):
    """The NVML library is missing or does not answer (no NVIDIA driver)."""


def reasons_mean_slowdown(reasons: int) -> bool:
    """Pure: whether NVML's clock-event reasons report a thermal or power-brake slowdown."""
    return bool(reasons & (NVML_HW_SLOWDOWN | NVML_SW_THERMAL_SLOWDOWN | NVML_HW_THERMAL_SLOWDOWN
                           | NVML_HW_POWER_BRAKE_SLOWDOWN))


def _text(value):
    return value.decode() if isinstance(value, bytes) else value


def read(call, *args):
    """One NVML query; "not supported" and other NVML errors read as unavailable."""
    import pynvml

    try:
        return _text(call(*args))
    except pynvml.NVMLError as exc:
        return unavailable(f"NVML: {exc}")


class Nvml:
    """An open NVML session with every card by PCI address. Use as a context manager, or close()."""

    def __init__(self):
        try:
            import pynvml

            pynvml.nvmlInit()
        except ImportError:
            raise NvmlUnavailable("nvidia-ml-py is not installed") from None
        except Exception as exc:  # pynvml.NVMLError_LibraryNotFound and friends
            raise NvmlUnavailable(str(exc)) from None
        self.lib = pynvml
        self.handles: dict[str, object] = {}
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            pci = read(pynvml.nvmlDeviceGetPciInfo, handle)
            address = f"nvml-index-{i}" if is_unavailable(pci) else normalize_address(_text(pci.busId))
            self.handles[address] = handle

    def close(self) -> None:
        self.lib.nvmlShutdown()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- what discovery records ---------------------------------------------------------------------

    def raw_details(self) -> list[dict]:
        """One raw dict per card, straight from NVML (translate() turns it into the topology's form)."""
        n = self.lib
        out = []
        for i, (address, h) in enumerate(self.handles.items()):
            mem = read(n.nvmlDeviceGetMemoryInfo, h)
            out.append({
                "index": i, "name": read(n.nvmlDeviceGetName, h), "uuid": read(n.nvmlDeviceGetUUID, h),
                "pci_bus_id": address,
                "memory_total": mem if is_unavailable(mem) else mem.total,
                "memory_free": mem if is_unavailable(mem) else mem.free,
                "compute_capability": read(n.nvmlDeviceGetCudaComputeCapability, h),
                "power_limit_constraints": read(n.nvmlDeviceGetPowerManagementLimitConstraints, h),
                "power_limit_default": read(n.nvmlDeviceGetPowerManagementDefaultLimit, h),
                "power_limit": read(n.nvmlDeviceGetPowerManagementLimit, h),
                "temp_slowdown": read(n.nvmlDeviceGetTemperatureThreshold, h, n.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN),
                "temp_shutdown": read(n.nvmlDeviceGetTemperatureThreshold, h, n.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN),
                "nvlink_peers": self._nvlink_peers(h),
            })
        return out

    def status(self) -> dict:
        return {"available": True, "driver_version": read(self.lib.nvmlSystemGetDriverVersion),
                "cuda_driver_version": read(self.lib.nvmlSystemGetCudaDriverVersion)}

    def _nvlink_peers(self, handle) -> list[str] | dict:
        """PCI addresses of the cards at the other end of each active NVLink; unavailable if the card has none."""
        n = self.lib
        peers = []
        for link in range(getattr(n, "NVML_NVLINK_MAX_LINKS", 18)):
            state = read(n.nvmlDeviceGetNvLinkState, handle, link)
            if is_unavailable(state):
                # NVML answers "not supported" past the card's last link, or at link 0 on cards without NVLink.
                return state if link == 0 else peers
            if state:
                remote = read(n.nvmlDeviceGetNvLinkRemotePciInfo, handle, link)
                if not is_unavailable(remote):
                    peers.append(normalize_address(_text(remote.busId)))
        return peers

    # ---- what the governor reads and sets -----------------------------------------------------------

    def limits_w(self, address: str) -> tuple[float, float, float]:
        """(min, max, default) power limit in watts; NVMLError where the card cannot report them."""
        h = self.handles[address]
        lo, hi = self.lib.nvmlDeviceGetPowerManagementLimitConstraints(h)
        default = self.lib.nvmlDeviceGetPowerManagementDefaultLimit(h)
        return lo / 1000, hi / 1000, default / 1000

    def name(self, address: str) -> str:
        return _text(self.lib.nvmlDeviceGetName(self.handles[address]))

    def sample(self, address: str) -> dict:
        """Temperature (C), power and limit (W), slowdown, VRAM used/total: None where unsupported."""
        n, h = self.lib, self.handles[address]

        def get(call, *args):
            value = read(call, h, *args)
            return None if is_unavailable(value) else value
        power, limit = get(n.nvmlDeviceGetPowerUsage), get(n.nvmlDeviceGetPowerManagementLimit)
        reasons_call = getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            n.nvmlDeviceGetCurrentClocksThrottleReasons
        mem = get(n.nvmlDeviceGetMemoryInfo)
        return {"temperature_c": get(n.nvmlDeviceGetTemperature, n.NVML_TEMPERATURE_GPU),
                "power_w": power / 1000 if power is not None else None,
                "limit_w": limit / 1000 if limit is not None else None,
                "hw_slowdown": reasons_mean_slowdown(get(reasons_call) or 0),
                "vram_used_bytes": mem.used if mem else None, "vram_total_bytes": mem.total if mem else None}

    def set_limit_w(self, address: str, watts: float) -> None:
        """Raises pynvml.NVMLError when NVML refuses (the caller maps it to its own error)."""
        self.lib.nvmlDeviceSetPowerManagementLimit(self.handles[address], int(watts * 1000))


def snapshot() -> tuple[list[dict], dict]:
    """Every NVIDIA card's raw details and the source's status; unavailable with the reason where NVML is."""
    try:
        with Nvml() as nvml:
            return nvml.raw_details(), nvml.status()
    except NvmlUnavailable as exc:
        return [], unavailable(str(exc))


def _milliwatts_to_watts(value):
    return value if is_unavailable(value) else round(value / 1000.0, 3)


def translate(raw: dict) -> dict:
    """NVML's raw values in the topology's form (pure: tested with values recorded from real cards)."""
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
