"""Run the controller against simulated GPUs faster than real time (pure, deterministic)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from host_runtime.governor.control import GpuController, PowerPolicy, Reading, throttle_level
from host_runtime.governor.simulator import SimulatedGpu


@dataclass(frozen=True)
class Scenario:
    seconds: float = 600.0
    ambient_c: float = 25.0
    inlet_step_c: float = 0.0       # inlet (and the cards' ambient air) rises by this much...
    inlet_step_at_s: float = 0.0    # ...at this time
    gpus: int = 1
    dt: float = 0.5                 # one telemetry tick
    stale_from_s: float | None = None   # telemetry stops arriving from here (fail-safe check)
    whole_degrees: bool = False     # readings rounded down to whole degrees, as NVML and most hwmon sensors give


def run(scenario: Scenario, policy: PowerPolicy = PowerPolicy()) -> dict:
    sims = [SimulatedGpu(name=f"simulated-gpu-{i}", ambient_c=scenario.ambient_c, temperature_c=scenario.ambient_c + 5)
            for i in range(scenario.gpus)]
    ctrls = [GpuController(s.limits, policy) for s in sims]
    steps = int(round(scenario.seconds / scenario.dt))
    trace = [[] for _ in sims]          # (t, temperature, target, limit)
    changes = [[] for _ in sims]
    max_throttle = 0
    last_fresh = 0.0
    for k in range(steps + 1):
        t = k * scenario.dt
        inlet = scenario.ambient_c + (scenario.inlet_step_c if t >= scenario.inlet_step_at_s and
                                      scenario.inlet_step_c else 0.0)
        stale = scenario.stale_from_s is not None and t >= scenario.stale_from_s
        if not stale:
            last_fresh = t
        for i, (sim, ctrl) in enumerate(zip(sims, ctrls)):
            sim.ambient_c = inlet
            shown = math.floor(sim.temperature_c) if scenario.whole_degrees else sim.temperature_c
            reading = Reading(shown, age_s=t - last_fresh, hw_slowdown=sim.hw_slowdown())
            before = ctrl.state
            sim.limit_w, state = ctrl.step(reading, scenario.dt, inlet_c=inlet)
            if state != before:
                changes[i].append({"t_s": t, "from": before, "to": state})
            trace[i].append((t, sim.temperature_c, ctrl.target_c(inlet), sim.limit_w))
            sim.advance(scenario.dt)
        level = throttle_level([c.state for c in ctrls], [c.limit_w for c in ctrls], [s.limits.min_w for s in sims])
        max_throttle = max(max_throttle, level)
    return {
        "backend": "simulator",
        "scenario": scenario.__dict__,
        "policy": policy.__dict__,
        "gpus": [summarise(sim, ctrl, tr, ch, policy, scenario) for sim, ctrl, tr, ch in zip(sims, ctrls, trace, changes)],
        "final_throttle_level": throttle_level([c.state for c in ctrls], [c.limit_w for c in ctrls],
                                               [s.limits.min_w for s in sims]),
        "max_throttle_level": max_throttle,
    }


def summarise(sim: SimulatedGpu, ctrl: GpuController, trace: list, changes: list, policy: PowerPolicy,
              scenario: Scenario) -> dict:
    peak = max(trace, key=lambda row: row[1])
    overshoot = max(row[1] - row[2] for row in trace)
    # Settling: from the last disturbance on, the first time after which the temperature stays in the band.
    start = scenario.inlet_step_at_s if scenario.inlet_step_c else 0.0
    window = [row for row in trace if row[0] >= start]
    settled_at = None
    for row in reversed(window):
        if abs(row[1] - row[2]) > policy.band_c:
            break
        settled_at = row[0]
    limits = [row[3] for row in trace]
    last_5_min = [row[3] for row in trace if row[0] >= trace[-1][0] - 300]
    return {
        "name": sim.name,
        "peak_temperature_c": round(peak[1], 2),
        "peak_at_s": peak[0],
        "overshoot_over_target_c": round(max(0.0, overshoot), 2),
        "settling_time_s": None if settled_at is None else round(settled_at - start, 1),
        "final_temperature_c": round(trace[-1][1], 2),
        "final_target_c": round(trace[-1][2], 2),
        "final_limit_w": round(ctrl.limit_w, 1),
        "limit_range_seen_w": [round(min(limits), 1), round(max(limits), 1)],
        # Hunting: how far the limit still moves in the last five minutes (0 once it holds).
        "limit_swing_last_5_min_w": round(max(last_5_min) - min(last_5_min), 1),
        "card_limits_w": [sim.limits.min_w, sim.limits.max_w],
        "final_state": ctrl.state,
        "state_changes": changes,
    }


def sweep(ambients=range(20, 36), policy: PowerPolicy = PowerPolicy(), base: Scenario = Scenario(seconds=900)) -> list:
    """Cold starts under full load at each inlet temperature, with exact and whole-degree readings: the
    figures the control law is tuned against (overshoot, settling, hunting)."""
    rows = []
    for ambient in ambients:
        for whole in (False, True):
            g = run(replace(base, ambient_c=float(ambient), whole_degrees=whole), policy)["gpus"][0]
            rows.append({"ambient_c": ambient, "whole_degrees": whole, "target_c": g["final_target_c"],
                         "overshoot_c": g["overshoot_over_target_c"], "settling_s": g["settling_time_s"],
                         "limit_swing_last_5_min_w": g["limit_swing_last_5_min_w"], "final_limit_w": g["final_limit_w"]})
    return rows
