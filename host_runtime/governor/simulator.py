"""The simulated GPU (a simulator backend, named as such): a first-order thermal model.

    C * dT/dt = P - G(fan) * (T - T_ambient),   P = min(limit, demand),   G = G_IDLE + G_FAN * fan

with the fan following a simple curve of temperature. The card reports a hardware
slowdown at its slowdown threshold, as a real one would. Deterministic: the same inputs
give the same trajectory, so control tests can bound overshoot and settling exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

from host_runtime.governor.control import GpuLimits


@dataclass
class SimulatedGpu:
    name: str = "simulated-gpu-0"
    limits: GpuLimits = GpuLimits(min_w=100.0, max_w=350.0, default_w=350.0)   # an RTX 3090's range
    capacity_j_per_c: float = 220.0     # thermal mass: time constant C/G, 40-75 s here
    g_idle_w_per_c: float = 2.9
    g_fan_w_per_c: float = 2.6
    slowdown_c: float = 90.0
    ambient_c: float = 25.0
    temperature_c: float = 30.0
    demand_w: float = 350.0             # what the workload would draw without a cap
    limit_w: float = 350.0

    def fan(self) -> float:
        return min(1.0, max(0.3, (self.temperature_c - 40.0) / 40.0))

    def power_w(self) -> float:
        return min(self.limit_w, self.demand_w)

    def advance(self, dt: float) -> None:
        g = self.g_idle_w_per_c + self.g_fan_w_per_c * self.fan()
        self.temperature_c += dt * (self.power_w() - g * (self.temperature_c - self.ambient_c)) / self.capacity_j_per_c

    def hw_slowdown(self) -> bool:
        return self.temperature_c >= self.slowdown_c
