"""Where GPU temperatures and power limits come from and go to: NVML, amdgpu hwmon (both through the GPU
layer, host_runtime/gpu, which discovery reads too), or the simulator.

All backends give the same readings, each card named by its PCI address; errors from their libraries
become GovernorBackendError.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from host_runtime.common.errors import UnavailableError
from host_runtime.governor.control import GpuLimits
from host_runtime.governor.simulator import SimulatedGpu
from host_runtime.gpu import amdgpu
from host_runtime.gpu.nvml import Nvml, NvmlUnavailable


class GovernorBackendError(UnavailableError):
    pass


@dataclass(frozen=True)
class GpuReading:
    gpu_id: str
    temperature_c: float | None
    power_w: float | None
    limit_w: float | None
    hw_slowdown: bool
    read_at: float  # when it was read, on the backend's clock (time.monotonic() for real cards)
    vram_used_bytes: int | None = None
    vram_total_bytes: int | None = None


@dataclass(frozen=True)
class GpuInfo:
    gpu_id: str
    name: str
    limits: GpuLimits


class NvmlBackend:
    """NVIDIA cards through the GPU layer's NVML session, each named by its PCI address."""

    name = "nvml"

    def __init__(self):
        try:
            self._nvml = Nvml()
        except NvmlUnavailable as exc:
            raise GovernorBackendError(f"NVML is not available: {exc}") from None

    def gpus(self) -> list[GpuInfo]:
        return [GpuInfo(address, self._nvml.name(address), GpuLimits(*self._nvml.limits_w(address)))
                for address in self._nvml.handles]

    def read(self) -> list[GpuReading]:
        return [GpuReading(address, read_at=time.monotonic(), **self._nvml.sample(address))
                for address in self._nvml.handles]

    def set_limit(self, gpu_id: str, watts: float) -> None:
        try:
            self._nvml.set_limit_w(gpu_id, watts)
        except self._nvml.lib.NVMLError as exc:
            raise GovernorBackendError(f"NVML refused a {watts:.0f} W limit on {gpu_id}: {exc}") from None


class AmdHwmonBackend:
    """amdgpu through the GPU layer's hwmon reader, each card named by its PCI address."""

    name = "amdgpu"

    def __init__(self, sys_root: Path = Path("/sys")):
        self._cards = amdgpu.hwmon_cards(sys_root)
        if not self._cards:
            raise GovernorBackendError("no amdgpu hwmon found")

    def gpus(self) -> list[GpuInfo]:
        return [GpuInfo(pci, f"amdgpu {pci}", GpuLimits(*amdgpu.limits_w(hw))) for pci, hw in self._cards.items()]

    def read(self) -> list[GpuReading]:
        return [GpuReading(pci, read_at=time.monotonic(), **amdgpu.sample(hw)) for pci, hw in self._cards.items()]

    def set_limit(self, gpu_id: str, watts: float) -> None:
        try:
            amdgpu.set_limit_w(self._cards[gpu_id], watts)
        except OSError as exc:
            raise GovernorBackendError(f"cannot set the amdgpu power cap of {gpu_id}: {exc.strerror}") from None


class SimulatorBackend:
    """Simulated GPUs advancing with the wall clock (times `time_scale`), so the whole loop runs anywhere."""

    name = "simulator"

    def __init__(self, gpus: int = 2, ambient_c: float = 25.0, time_scale: float = 1.0):
        self.sims = [SimulatedGpu(name=f"simulated-gpu-{i}", ambient_c=ambient_c, temperature_c=ambient_c + 5)
                     for i in range(gpus)]
        self.time_scale = time_scale
        self._started = time.monotonic()
        self._last = self.clock()

    def clock(self) -> float:
        """Simulated seconds: the wall clock, sped up by time_scale (the governor's dt is in these)."""
        return (time.monotonic() - self._started) * self.time_scale

    def set_ambient(self, celsius: float) -> None:
        for s in self.sims:
            s.ambient_c = celsius

    def gpus(self) -> list[GpuInfo]:
        return [GpuInfo(s.name, f"{s.name} (simulator)", s.limits) for s in self.sims]

    def read(self) -> list[GpuReading]:
        now = self.clock()
        elapsed, self._last = now - self._last, now
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
