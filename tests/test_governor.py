"""The governor's control law against the simulated GPU (deterministic: bounds are exact, in simulated seconds)."""

from __future__ import annotations

import json
import random
import subprocess

import pytest

from host_runtime.governor.control import GpuController, GpuLimits, PowerPolicy, Reading, throttle_level
from host_runtime.governor.simulate import Scenario, run
from tests.servers import everycycle

RTX3090 = GpuLimits(min_w=100.0, max_w=350.0, default_w=350.0)


def test_cold_start_under_full_load_settles_in_the_band_without_oscillating():
    summary = run(Scenario(seconds=900))
    g = summary["gpus"][0]
    assert summary["backend"] == "simulator"
    assert g["overshoot_over_target_c"] <= 3.0
    assert g["settling_time_s"] is not None and g["settling_time_s"] <= 120
    assert abs(g["final_temperature_c"] - 75.0) <= 2.0
    assert g["final_state"] == "controlling"
    # One transition (idle -> controlling), no bouncing between states.
    assert [c["to"] for c in g["state_changes"]] == ["controlling"]


def test_the_limit_does_not_hunt_once_settled():
    policy = PowerPolicy()
    from host_runtime.governor.simulator import SimulatedGpu

    sim, ctrl = SimulatedGpu(), GpuController(RTX3090, policy)
    limits = []
    for k in range(1800):
        sim.limit_w, _ = ctrl.step(Reading(sim.temperature_c, 0.0, sim.hw_slowdown()), 0.5)
        sim.advance(0.5)
        if k >= 1200:  # the last 5 simulated minutes
            limits.append(sim.limit_w)
    assert max(limits) - min(limits) < 2.0


def test_a_hot_inlet_lowers_the_limits():
    calm = run(Scenario(seconds=900, gpus=2))
    hot = run(Scenario(seconds=900, gpus=2, inlet_step_c=10.0, inlet_step_at_s=450))
    for before, after in zip(calm["gpus"], hot["gpus"]):
        assert after["final_limit_w"] < before["final_limit_w"] - 50
        assert after["final_target_c"] == 65.0  # 10 degrees over the reference, slope 1
        assert abs(after["final_temperature_c"] - 65.0) <= 2.0


def test_stale_telemetry_forces_the_safe_limit():
    summary = run(Scenario(seconds=400, stale_from_s=200))
    g = summary["gpus"][0]
    assert g["final_state"] == "failsafe"
    assert g["final_limit_w"] == 225.0  # halfway between 100 and 350
    assert summary["final_throttle_level"] == 2
    # Only after the bound: at 204 s the reading is 4 s old and still trusted.
    assert [c for c in g["state_changes"] if c["to"] == "failsafe"][0]["t_s"] > 200 + 5 - 0.5


def test_hardware_slowdown_is_an_emergency_at_once_then_recovers():
    ctrl = GpuController(RTX3090, PowerPolicy())
    ctrl.step(Reading(70.0, 0.0), 0.5)
    assert ctrl.step(Reading(80.0, 0.0, hw_slowdown=True), 0.5) == (100.0, "emergency")
    assert ctrl.step(Reading(88.0, 0.0), 0.5) == (100.0, "emergency")  # over the ceiling
    limit, state = ctrl.step(Reading(60.0, 0.0), 0.5)
    assert state == "recovering" and 100.0 <= limit <= 100.0 + 10.0 * 0.5  # slews up, rate-limited
    for _ in range(20):
        limit, state = ctrl.step(Reading(74.0, 0.0), 0.5)
    assert state == "controlling"


def test_limits_never_leave_the_card_range():
    for ambient in (5.0, 25.0, 40.0, 60.0):
        for step in (0.0, 15.0):
            s = run(Scenario(seconds=300, ambient_c=ambient, inlet_step_c=step, inlet_step_at_s=150))
            lo, hi = s["gpus"][0]["limit_range_seen_w"]
            assert 100.0 <= lo <= hi <= 350.0
    rng = random.Random(7)
    ctrl = GpuController(RTX3090, PowerPolicy())
    for _ in range(5000):
        reading = Reading(rng.uniform(-20, 120), rng.choice([0.0, 0.0, 0.0, 10.0]), rng.random() < 0.05)
        limit, _ = ctrl.step(reading, rng.choice([0.1, 0.5, 2.0]), inlet_c=rng.uniform(10, 50))
        assert 100.0 <= limit <= 350.0


def test_throttle_level():
    assert throttle_level(["controlling", "idle"], [250, 350], [100, 100]) == 0
    assert throttle_level(["controlling", "controlling"], [100, 300], [100, 100]) == 1
    assert throttle_level(["emergency", "idle"], [100, 350], [100, 100]) == 2
    assert throttle_level(["failsafe"], [225], [100]) == 2


def test_simulate_cli_prints_the_trajectory_summary():
    out = subprocess.run(everycycle("governor", "simulate", "--seconds", "300", "--inlet-step", "10@150", "--json"),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0
    doc = json.loads(out.stdout)
    assert doc["backend"] == "simulator" and doc["gpus"][0]["settling_time_s"] is not None
    bad = subprocess.run(everycycle("governor", "simulate", "--inlet-step", "hot"), capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 2 and "--inlet-step" in bad.stderr and "Traceback" not in bad.stderr


def test_every_inlet_from_20_to_35_c_settles_without_overshoot_or_hunting():
    """At a 35 C inlet the target drops to 65 C: the old law only started controlling there and overshot 7.2 C."""
    from host_runtime.governor.simulate import sweep

    rows = sweep(range(20, 36))
    assert len(rows) == 32
    for row in rows:
        assert row["overshoot_c"] <= 2.0, row
        assert row["settling_s"] is not None and row["settling_s"] <= 300, row
        assert row["limit_swing_last_5_min_w"] < 2.0, row  # whole-degree readings must not make it hunt


def test_every_reader_judges_the_governors_state_by_one_rule(tmp_path):
    import json
    import time

    from host_runtime.engine.throttle import ThrottleReader
    from host_runtime.governor.state_file import STATE_FRESH_S, read_state

    path = tmp_path / "governor.json"
    assert read_state(None).reason == "no governor state configured (--governor-state)"
    assert not read_state(path).fresh and "cannot be read" in read_state(path).reason
    path.write_text("{not json")
    assert read_state(path).doc is None and "cannot be read" in read_state(path).reason
    path.write_text(json.dumps({"throttle_level": 2, "updated_unix": time.time()}))
    assert read_state(path).fresh and read_state(path).get("throttle_level") == 2
    assert ThrottleReader(str(path)).level() == 2
    path.write_text(json.dumps({"throttle_level": 2, "updated_unix": time.time() - STATE_FRESH_S - 5}))
    stale = read_state(path)
    assert not stale.fresh and stale.doc is not None and stale.reason.endswith("s old")
    assert ThrottleReader(str(path)).level() == 0  # the same rule: a stale hint throttles nothing


def test_the_governors_settings_are_said_once_and_make_its_flags_and_box_tomls_power_table(capsys):
    """#57: `governor run --target` took any number (governor.toml takes 30-95) and restated the default 75 that
    the control loop, governor.toml and box.toml's schema each said again. Now the flags, [power]'s model and
    from_box are made from GovernorSettings' declarations, whose defaults are the control loop's own."""
    from host_runtime.cli import build_parser
    from host_runtime.common.setting_rules import SettingsError, tunables
    from host_runtime.governor.control import PowerPolicy
    from host_runtime.governor.settings import GovernorSettings, from_box
    from provisioning.box_model import Power

    declared = {t.name: t for t in tunables(GovernorSettings)}
    assert set(Power.model_fields) == {name for name, t in declared.items() if t.box} == {
        "mode", "target_c", "ceiling_c", "safe_fraction"}
    for name in Power.model_fields:
        assert Power.model_fields[name].description == declared[name].described
    assert (GovernorSettings().target_c, GovernorSettings().ceiling_c) == (PowerPolicy().target_c,
                                                                           PowerPolicy().ceiling_c)
    with pytest.raises(SettingsError) as refused:
        GovernorSettings(target_c=200.0)
    for command in (["governor", "run"], ["governor", "simulate"]):
        with pytest.raises(SystemExit):
            build_parser().parse_args([*command, "--target", "200"])
        assert f"argument --target: {refused.value.message}" in capsys.readouterr().err
    assert build_parser().parse_args(["governor", "run", "--target", "70"]).target == 70.0
    assert from_box({"power": {"target_c": 70, "mode": "enforce"}}) == GovernorSettings(target_c=70.0,
                                                                                         mode="enforce")
    with pytest.raises(SettingsError, match=r"^power\.ceiling_c: must be between 40 and 105"):
        from_box({"power": {"ceiling_c": 200}})
