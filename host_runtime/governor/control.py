"""The control law (pure): one controller per GPU, no I/O, no clock of its own.

Law: velocity-form integral control on the temperature error with derivative damping,

    L[k+1] = clamp( L[k] - KI * (F[k] - T_target) * dt - KD * (F[k] - F[k-1]),  L_min, L_max )

where F is the reading smoothed over SMOOTHING_S (cards report whole degrees: on raw readings the derivative
term turns each one-degree flicker into a KD-watt jump, and the limit hunts).

with the rise limited to UP_RATE watts per second. Acting on the *change* of the limit
means the clamp is the anti-windup: there is no integrator state to wind up while the
limit sits at a bound. Derivative on the measurement (not the error) damps overshoot
without kicking when the target moves (a hot inlet lowers it).

States: idle (below the trigger: the limit slews up to the card's maximum),
controlling (the law), emergency (over the hard ceiling or a hardware slowdown: the
floor at once), recovering (after an emergency: the law, until back near target),
failsafe (telemetry lost or stale: the configured safe limit, never a high cap).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class PowerPolicy:
    target_c: float = 75.0          # hold each GPU at or under this
    # Below this the governor leaves the card alone (idle). It is stated for the reference inlet and moves down
    # with the target: a hot inlet lowers the target, and control must still start this far below it.
    trigger_c: float = 65.0
    ceiling_c: float = 87.0         # at or above: emergency
    # Tuned on the simulator at inlets of 20..35 C, with exact and whole-degree readings (simulate.sweep):
    # overshoot <= 0.1 C, settled within 75 s, no hunting. The old 0.8/12 overshot 7.2 C at 35 C.
    ki_w_per_c_s: float = 1.2       # KI: watts per degree of error per second
    kd_w_per_c: float = 30.0        # KD: watts per degree of change between ticks (of the smoothed reading)
    smoothing_s: float = 3.0        # the reading's smoothing time constant
    up_rate_w_per_s: float = 10.0   # fastest rise of a limit
    band_c: float = 2.0             # "at target": within this of it
    safe_fraction: float = 0.5      # failsafe limit: this far from min to max
    stale_after_s: float = 5.0      # telemetry older than this is lost
    inlet_ref_c: float = 25.0       # chassis inlet at or below this: full target
    inlet_slope: float = 1.0        # target drops this many degrees per degree of inlet above the reference


@dataclass(frozen=True)
class GpuLimits:
    min_w: float
    max_w: float
    default_w: float


@dataclass(frozen=True)
class Reading:
    temperature_c: float | None      # None: no reading
    age_s: float                     # how old the reading is
    hw_slowdown: bool = False        # the card reports a thermal or power-brake slowdown


@dataclass
class GpuController:
    limits: GpuLimits
    policy: PowerPolicy
    limit_w: float = field(default=-1.0)
    state: str = "idle"
    last_temperature: float | None = None   # the smoothed reading of the previous tick

    def __post_init__(self):
        if self.limit_w < 0:
            self.limit_w = self.limits.default_w

    def target_c(self, inlet_c: float | None) -> float:
        """The target after chassis awareness: a hot inlet lowers it, so the box backs off early."""
        if inlet_c is None:
            return self.policy.target_c
        return self.policy.target_c - self.policy.inlet_slope * max(0.0, inlet_c - self.policy.inlet_ref_c)

    def trigger_c(self, inlet_c: float | None) -> float:
        return self.policy.trigger_c - (self.policy.target_c - self.target_c(inlet_c))

    def safe_w(self) -> float:
        lo, hi = self.limits.min_w, self.limits.max_w
        return lo + self.policy.safe_fraction * (hi - lo)

    def step(self, reading: Reading, dt: float, inlet_c: float | None = None) -> tuple[float, str]:
        """One tick: the new limit (watts) and state."""
        p, lo, hi = self.policy, self.limits.min_w, self.limits.max_w
        if reading.temperature_c is None or reading.age_s > p.stale_after_s:
            self.state, self.limit_w, self.last_temperature = "failsafe", self.safe_w(), None
            return self.limit_w, self.state
        raw = reading.temperature_c
        target, trigger = self.target_c(inlet_c), self.trigger_c(inlet_c)
        previous = self.last_temperature if self.last_temperature is not None else raw
        # The ceiling acts on the raw reading (no delay); the law on the smoothed one.
        t = previous + (raw - previous) * dt / (p.smoothing_s + dt) if p.smoothing_s > 0 else raw
        self.last_temperature = t

        if raw >= p.ceiling_c or reading.hw_slowdown:
            self.state, self.limit_w = "emergency", lo
            return self.limit_w, self.state
        if self.state == "emergency":
            self.state = "recovering"
        elif self.state == "failsafe":
            self.state = "recovering"

        if self.state == "idle" and t >= trigger:
            self.state = "controlling"
        if self.state == "recovering" and t >= target - p.band_c:
            self.state = "controlling"

        if self.state == "idle":
            wanted = hi
        else:
            wanted = self.limit_w - p.ki_w_per_c_s * (t - target) * dt - p.kd_w_per_c * (t - previous)
        wanted = min(wanted, self.limit_w + p.up_rate_w_per_s * dt)  # rate-limited on the way up
        self.limit_w = min(hi, max(lo, wanted))
        if self.state == "controlling" and t < trigger - p.band_c and self.limit_w >= hi:
            self.state = "idle"
        return self.limit_w, self.state


def throttle_level(states: list[str], limits: list[float], floors: list[float]) -> int:
    """The admission hint: 0 normal, 1 a GPU sits at its floor, 2 a GPU is in emergency or failsafe."""
    if any(s in ("emergency", "failsafe") for s in states):
        return 2
    if any(limit <= floor + 1e-6 for limit, floor in zip(limits, floors)):
        return 1
    return 0
