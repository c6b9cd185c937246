"""Where GPU temperatures and power limits come from and go to: NVML, amdgpu hwmon, or the simulator.

All backends give the same readings; errors from their libraries become GovernorBackendError.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from host_runtime.governor.control import GpuLimits
from host_runtime.governor.simulator import SimulatedGpu


class GovernorBackendError(Exception):
    pass


@dataclass(frozen=True)
class GpuReading:
    gpu_id: str
    temperature_c: float | None
    power_w: float | None
    limit_w: float | None
    hw_slowdown: bool
    read_at: float  # time.monotonic() of the reading
    vram_used_bytes: int | None = None
    vram_total_bytes: int | None = None


@dataclass(frozen=True)
class GpuInfo:
    gpu_id: str
    name: str
    limits: GpuLimits


# NVML clock-event ("throttle") reason bits that mean the hardware is protecting itself.
NVML_HW_SLOWDOWN = 0x8
NVML_SW_THERMAL_SLOWDOWN = 0x20
NVML_HW_THERMAL_SLOWDOWN = 0x40
NVML_HW_POWER_BRAKE_SLOWDOWN = 0x80


def nvml_reasons_mean_slowdown(reasons: int) -> bool:
    """Pure: whether NVML's clock-event reasons report a thermal or power-brake slowdown."""
    return bool(reasons & (NVML_HW_SLOWDOWN | NVML_SW_THERMAL_SLOWDOWN | NVML_HW_THERMAL_SLOWDOWN
                           | NVML_HW_POWER_BRAKE_SLOWDOWN))


class NvmlBackend:
    name = "nvml"

    def __init__(self):
        try:
            import pynvml

            pynvml.nvmlInit()
        except Exception as exc:
            raise GovernorBackendError(f"NVML is not available: {exc}") from None
        self._nvml = pynvml
        self._handles = {}
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            self._handles[pynvml.nvmlDeviceGetUUID(h)] = h

    def gpus(self) -> list[GpuInfo]:
        out = []
        for uuid, h in self._handles.items():
            lo, hi = self._nvml.nvmlDeviceGetPowerManagementLimitConstraints(h)
            default = self._nvml.nvmlDeviceGetPowerManagementDefaultLimit(h)
            out.append(GpuInfo(uuid, self._nvml.nvmlDeviceGetName(h), GpuLimits(lo / 1000, hi / 1000, default / 1000)))
        return out

    def read(self) -> list[GpuReading]:
        n = self._nvml
        out = []
        for uuid, h in self._handles.items():
            def get(call, *args):
                try:
                    return call(h, *args)
                except n.NVMLError:
                    return None
            temp = get(n.nvmlDeviceGetTemperature, n.NVML_TEMPERATURE_GPU)
            power = get(n.nvmlDeviceGetPowerUsage)
            limit = get(n.nvmlDeviceGetPowerManagementLimit)
            reasons_call = getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
                n.nvmlDeviceGetCurrentClocksThrottleReasons
            reasons = get(reasons_call) or 0
            mem = get(n.nvmlDeviceGetMemoryInfo)
            out.append(GpuReading(uuid, temp, power / 1000 if power is not None else None,
                                  limit / 1000 if limit is not None else None, nvml_reasons_mean_slowdown(reasons),
                                  time.monotonic(), mem.used if mem else None, mem.total if mem else None))
        return out

    def set_limit(self, gpu_id: str, watts: float) -> None:
        try:
            self._nvml.nvmlDeviceSetPowerManagementLimit(self._handles[gpu_id], int(watts * 1000))
        except self._nvml.NVMLError as exc:
            raise GovernorBackendError(f"NVML refused a {watts:.0f} W limit on {gpu_id}: {exc}") from None


class AmdHwmonBackend:
    """amdgpu through its hwmon files: temp1_input (m°C), power1_average and power1_cap (µW)."""

    name = "amdgpu"

    def __init__(self, sys_root: Path = Path("/sys")):
        self._cards = {}
        for hw in sorted(sys_root.glob("class/drm/card[0-9]*/device/hwmon/hwmon*")):
            if (hw / "name").exists() and (hw / "name").read_text().strip() == "amdgpu":
                self._cards[hw.parent.parent.resolve().name] = hw
        if not self._cards:
            raise GovernorBackendError("no amdgpu hwmon found")

    @staticmethod
    def _int(path: Path) -> int | None:
        try:
            return int(path.read_text())
        except (OSError, ValueError):
            return None

    def gpus(self) -> list[GpuInfo]:
        out = []
        for pci, hw in self._cards.items():
            lo, hi = self._int(hw / "power1_cap_min") or 0, self._int(hw / "power1_cap_max") or 0
            default = self._int(hw / "power1_cap_default") or hi
            out.append(GpuInfo(pci, f"amdgpu {pci}", GpuLimits(lo / 1e6, hi / 1e6, default / 1e6)))
        return out

    def read(self) -> list[GpuReading]:
        out = []
        for pci, hw in self._cards.items():
            t, p, cap = self._int(hw / "temp1_input"), self._int(hw / "power1_average"), self._int(hw / "power1_cap")
            device = hw.parent.parent
            out.append(GpuReading(pci, t / 1000 if t is not None else None, p / 1e6 if p is not None else None,
                                  cap / 1e6 if cap is not None else None, False, time.monotonic(),
                                  self._int(device / "mem_info_vram_used"), self._int(device / "mem_info_vram_total")))
        return out

    def set_limit(self, gpu_id: str, watts: float) -> None:
        try:
            (self._cards[gpu_id] / "power1_cap").write_text(str(int(watts * 1e6)))
        except OSError as exc:
            raise GovernorBackendError(f"cannot set the amdgpu power cap of {gpu_id}: {exc.strerror}") from None


class SimulatorBackend:
    """Simulated GPUs advancing with the wall clock (times `time_scale`), so the whole loop runs anywhere."""

    name = "simulator"

    def __init__(self, gpus: int = 2, ambient_c: float = 25.0, time_scale: float = 1.0):
        self.sims = [SimulatedGpu(name=f"simulated-gpu-{i}", ambient_c=ambient_c, temperature_c=ambient_c + 5)
                     for i in range(gpus)]
        self.time_scale = time_scale
        self._last = time.monotonic()

    def set_ambient(self, celsius: float) -> None:
        for s in self.sims:
            s.ambient_c = celsius

    def gpus(self) -> list[GpuInfo]:
        return [GpuInfo(s.name, f"{s.name} (simulator)", s.limits) for s in self.sims]

    def read(self) -> list[GpuReading]:
        now = time.monotonic()
        elapsed, self._last = (now - self._last) * self.time_scale, now
        for s in self.sims:
            left = elapsed
            while left > 1e-9:  # small steps keep the model stable at high time scales
                step = min(0.5, left)
                s.advance(step)
                left -= step
        # A simulated 24 GiB card holding a ~4 GiB model.
        return [GpuReading(s.name, s.temperature_c, s.power_w(), s.limit_w, s.hw_slowdown(), now, 4 << 30, 24 << 30)
                for s in self.sims]

    def set_limit(self, gpu_id: str, watts: float) -> None:
        next(s for s in self.sims if s.name == gpu_id).limit_w = watts


class NoGpuBackend:
    """A box with no GPU the governor can read (a plain PC): nothing to govern, so it idles and says so."""

    name = "none"

    def gpus(self) -> list[GpuInfo]:
        return []

    def read(self) -> list[GpuReading]:
        return []

    def set_limit(self, gpu_id: str, watts: float) -> None:
        raise GovernorBackendError(f"there is no GPU {gpu_id!r} on this box")


def detect_backend() -> tuple[NvmlBackend | AmdHwmonBackend | NoGpuBackend, list[str]]:
    """The image's default: NVIDIA cards through NVML, else amdgpu's hwmon, else none.

    Returns the backend and why each one before it was passed over, for the log."""
    passed_over = []
    for cls in (NvmlBackend, AmdHwmonBackend):
        try:
            backend = cls()
        except GovernorBackendError as exc:
            passed_over.append(f"{cls.name}: {exc}")
            continue
        if backend.gpus():
            return backend, passed_over
        passed_over.append(f"{cls.name}: no GPUs")
    return NoGpuBackend(), passed_over
