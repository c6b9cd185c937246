"""The BMC agent against a real IPMI peer: OpenIPMI's ipmi_sim on 127.0.0.1, cross-checked with ipmitool."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import urllib.request

import pytest

from agent_bmc import dcmi, metrics
from agent_bmc.backends.ipmi import IpmiBackend
from agent_bmc.backends.local import LocalBackend
from agent_bmc.coordinator import Coordinator
from agent_bmc.errors import BmcCommandFailed
from agent_bmc.fan_curve import FanCurve, RawFanCommand
from tests.equipment.ipmi_sim_env import PASSWORD, USER, IpmiSim
from tests.servers import Proc, everycycle, free_port, wait_for


@pytest.fixture
def sim(tmp_path):
    s = IpmiSim(tmp_path)
    yield s
    s.stop()


def coordinator_for(sim: IpmiSim, password: str = PASSWORD, period: float = 0.5, **kw) -> Coordinator:
    # The deadline the agent uses at its default period (5 s x 1.5): with 2 s, collections on a 2-core machine
    # that was busy elsewhere timed out (measured: 3.6 s warm, 7.4 s cold with both cores loaded).
    return Coordinator(IpmiBackend("127.0.0.1", sim.port, USER, password, kw.pop("fan_command", None)),
                       period_s=period, deadline_s=7.5, **kw)


def ipmitool_sdr(sim: IpmiSim) -> dict[str, str]:
    out = sim.ipmitool("sdr", "list").stdout
    return {line.split("|")[0].strip(): line.split("|")[1].strip() for line in out.splitlines() if "|" in line}


def test_readings_and_thresholds_agree_with_ipmitool(sim):
    c = coordinator_for(sim)
    c.collect_once()
    snap = c.view()
    assert snap["state"] == "ok" and snap["up"] and not snap["stale"]
    by_name = {s["name"]: s for s in snap["sensors"]}
    sdr = ipmitool_sdr(sim)
    assert set(by_name) == set(sdr)
    for name, text in sdr.items():
        assert float(text.split()[0]) == pytest.approx(by_name[name]["value"])
    assert by_name["Inlet Temp"]["units"] == "°C" and by_name["FAN1"]["value"] == 3000.0
    assert by_name["Inlet Temp"]["thresholds"] == {"upper_non_critical": 40.0, "upper_critical": 45.0,
                                                   "upper_non_recoverable": 50.0}
    assert by_name["12V"]["thresholds"]["upper_critical"] == pytest.approx(13.5)
    assert snap["fru"]["Board product name"] == "SimBoard 1"  # read 16 bytes at a time


def test_a_temperature_raised_mid_test_reaches_snapshot_and_metrics_as_critical(sim):
    c = coordinator_for(sim)
    c.collect_once()
    assert 'ipmi_temperature_state{id="1",name="Inlet Temp"} 0' in metrics.render(c.view())
    sim.set_raw(1, 47)  # over the 45 C critical threshold
    c.collect_once()
    inlet = next(s for s in c.view()["sensors"] if s["name"] == "Inlet Temp")
    assert inlet["value"] == 47.0 and inlet["health"] == "critical"
    text = metrics.render(c.view())
    assert 'ipmi_temperature_celsius{id="1",name="Inlet Temp"} 47.0' in text
    assert 'ipmi_temperature_state{id="1",name="Inlet Temp"} 2' in text
    assert ipmitool_sdr(sim)["Inlet Temp"].startswith("47")


def test_new_sel_entries_become_events(sim):
    c = coordinator_for(sim)
    c.collect_once()
    assert c.view()["sel"]["count"] == 0 and c.view()["events"] == []
    sim.console("sel_add 0x20 0x02 0x00 0x00 0x00 0x00 0x20 0x00 0x04 0x01 0x01 0x01 0x57 0x00 0x00")
    c.collect_once()
    c.collect_once()  # a second read does not repeat the same entry
    snap = c.view()
    assert snap["sel"]["count"] == 1 and len(snap["events"]) == 1
    assert snap["events"][0]["component"] == "Inlet Temp" and snap["events"][0]["timestamp"]
    assert "ipmi_sel_entries_count 1" in metrics.render(snap)
    assert len([line for line in sim.ipmitool("sel", "list").stdout.splitlines() if line.strip()]) == 1


def test_dcmi_power_reading_and_limit_cross_checked_with_ipmitool(sim):
    backend = IpmiBackend("127.0.0.1", sim.port, USER, PASSWORD)
    backend.connect()
    reading = backend.power()
    tool = sim.ipmitool("dcmi", "power", "reading").stdout
    assert reading["current_w"] == int(re.search(r"Instantaneous power reading:\s+(\d+)", tool).group(1)) == 220
    sim.console("dcmi_set_power 310")
    assert backend.power()["current_w"] == 310
    assert backend.power_limit()["active"] is False
    backend.set_power_limit(400, correction_ms=5000, sampling_s=2)
    limit = backend.power_limit()
    assert limit == {"active": True, "limit_w": 400, "correction_ms": 5000, "sampling_s": 2, "exception_action": 0}
    tool = sim.ipmitool("dcmi", "power", "get_limit").stdout
    assert re.search(r"Power Limit:\s+400 Watts", tool) and "Power Limit Active" in tool
    with pytest.raises(BmcCommandFailed) as exc:
        backend.set_power_limit(20)
    assert exc.value.code == 0x84 and "power limit out of range" in str(exc.value)
    assert sim.ipmitool("dcmi", "power", "set_limit", "limit", "350").returncode == 0
    assert backend.power_limit()["limit_w"] == 350


def start_agent(sim: IpmiSim, tmp_path, period: str) -> tuple[Proc, int]:
    """The real agent process against the simulator, serving on a free loopback port."""
    pw = tmp_path / "pw"
    pw.write_text(PASSWORD)
    os.chmod(pw, 0o600)
    port = free_port()
    agent = Proc(everycycle("bmc", "--backend", "ipmi", "--host", "127.0.0.1", "--port", str(sim.port), "--user", USER,
                            "--password-file", str(pw), "--listen", f"127.0.0.1:{port}", "--period", period),
                 tmp_path / "agent.log")
    return agent, port


def test_a_paused_bmc_goes_stale_fast_and_recovers(sim, tmp_path):
    agent, port = start_agent(sim, tmp_path, "1")
    url = f"http://127.0.0.1:{port}"

    def telemetry() -> tuple[dict, float]:
        started = time.monotonic()
        with urllib.request.urlopen(url + "/telemetry", timeout=5) as r:
            return json.loads(r.read()), time.monotonic() - started

    try:
        wait_for(lambda: _quiet(telemetry) and telemetry()[0]["state"] == "ok", 30, "the first collection", agent)
        sim.pause()
        stale_seen = None
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            snap, took = telemetry()
            assert took < 1.0  # the endpoint never waits for the BMC
            if snap["stale"] and not snap["up"]:
                stale_seen = snap
                break
            time.sleep(0.2)
        assert stale_seen is not None and stale_seen["state"] == "timeout"
        assert "ipmi_up 0" in urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()
        sim.resume()
        wait_for(lambda: telemetry()[0]["state"] == "ok" and not telemetry()[0]["stale"], 40, "recovery", agent)
        assert "ipmi_up 1" in urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()
    finally:
        sim.resume()
        agent.stop()


def _quiet(fn):
    try:
        fn()
        return True
    except OSError:
        return False


def test_wrong_password_no_bmc_and_unknown_host_are_clear_states(sim):
    for backend, state in [
        (IpmiBackend("127.0.0.1", sim.port, USER, "wrong-password"), "auth_failed"),
        (IpmiBackend("127.0.0.1", free_port(), USER, PASSWORD), "unreachable"),
        (IpmiBackend("no-such-bmc.invalid", 623, USER, PASSWORD), "unknown_host"),
    ]:
        c = Coordinator(backend, period_s=1.0, deadline_s=8.0)
        started = time.monotonic()
        c.collect_once()
        snap = c.view()
        took = time.monotonic() - started
        assert snap["state"] == state and snap["stale"] and not snap["up"], (state, snap["detail"])
        assert took < (7.5 if state == "unreachable" else 2.0)  # no BMC: pyghmi gives up after ~5 s
        assert "ipmi_up 0" in metrics.render(snap)


def test_a_refused_fan_policy_is_said_once_and_left_to_the_bmc(sim):
    # ipmi_sim has no vendor fan command: it answers 0xC1, as many real BMCs do for a foreign vendor's set.
    c = coordinator_for(sim, fan_curve=FanCurve(((30.0, 30), (60.0, 100))),
                        fan_command=RawFanCommand(0x30, 0x70, "0x66 0x01 0x00 {duty}"))
    c.collect_once()
    policy = c.view()["fan_policy"]
    assert policy["state"] == "refused" and "0xc1" in policy["detail"]
    c.collect_once()
    assert c.view()["fan_policy"]["state"] == "refused" and c.view()["state"] == "ok"


def test_fan_curve_and_dcmi_encoding():
    curve = FanCurve(((30.0, 20), (50.0, 60), (70.0, 100)))
    assert [curve.duty(t) for t in (10, 30, 40, 50, 65, 90)] == [20, 20, 40, 60, 90, 100]
    with pytest.raises(ValueError):
        FanCurve(((50.0, 20), (30.0, 60)))
    assert RawFanCommand(0x30, 0x70, "0x66 0x01 0x00 {duty}").render(55) == (0x70, (0x66, 0x01, 0x00, 55))
    req = dcmi.set_limit_request(400, correction_ms=5000, sampling_s=2)
    assert len(req) == 15 and req[0] == 0xDC and req[5:7] == (0x90, 0x01)
    assert dcmi.meaning(0x84) == "power limit out of range"


def test_the_local_backend_reports_what_hwmon_has_or_none_found():
    import psutil

    c = Coordinator(LocalBackend(), period_s=1.0)
    c.collect_once()
    snap = c.view()
    expected = sum(len(v) for v in (psutil.sensors_temperatures() or {}).values())
    assert len([s for s in snap["sensors"] if s["type"] == "temperature"]) == expected
    assert snap["state"] == ("ok" if snap["sensors"] else "none_found")
    assert snap["backend"] == "local" and snap["stale"] is False


def test_cli_errors_name_the_option(tmp_path):
    pw = tmp_path / "pw"
    pw.write_text("x")
    os.chmod(pw, 0o644)
    out = subprocess.run(everycycle("bmc", "--backend", "ipmi", "--host", "h", "--user", "u", "--password-file", str(pw)),
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "--password-file" in out.stderr and "0600" in out.stderr
    out = subprocess.run(everycycle("bmc", "--backend", "ipmi"), capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "--host" in out.stderr
    bad = tmp_path / "cfg.json"
    bad.write_text('{"backend": "local", "colour": "blue"}')
    out = subprocess.run(everycycle("bmc", "--config", str(bad)), capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "colour" in out.stderr


def test_a_hot_inlet_on_the_bmc_lowers_the_governors_limits(sim, tmp_path):
    """ipmi_sim -> the real agent endpoint -> the governor on simulated GPUs."""
    agent, port = start_agent(sim, tmp_path, "0.5")
    state = tmp_path / "governor.json"
    governor = Proc(everycycle("governor", "run", "--backend", "simulator", "--sim-speed", "60", "--tick", "0.1",
                               "--bmc-url", f"http://127.0.0.1:{port}/telemetry", "--state", str(state)),
                    tmp_path / "governor.log")

    def doc():
        try:
            return json.loads(state.read_text())
        except (OSError, ValueError):
            return None

    try:
        wait_for(lambda: (d := doc()) and d["inlet_c"] == 24.0 and all(g["state"] == "controlling" for g in d["gpus"]),
                 60, "the governor controlling with the BMC's 24 C inlet", governor)
        time.sleep(2)  # let the limits settle at the calm target
        calm = doc()
        assert all(g["target_c"] == 75.0 for g in calm["gpus"])
        sim.set_raw(1, 35)  # inlet 35 C: ten degrees over the reference
        wait_for(lambda: (d := doc()) and d["inlet_c"] == 35.0 and all(g["target_c"] == 65.0 for g in d["gpus"]),
                 30, "the hot inlet to reach the governor", governor)
        time.sleep(2)
        hot = doc()
        for before, after in zip(calm["gpus"], hot["gpus"]):
            assert after["decided_limit_w"] < before["decided_limit_w"] - 20
    finally:
        governor.stop()
        agent.stop()


def test_a_bmc_without_dcmi_still_serves_sensors_and_metrics(tmp_path):
    """Many older boards have no DCMI: /metrics answered 500 on them (the power part had no current_w)."""
    sim = IpmiSim(tmp_path, with_dcmi=False)
    agent = None
    try:
        agent, port = start_agent(sim, tmp_path, "1")
        base = f"http://127.0.0.1:{port}"
        def collected() -> bool:
            try:
                return json.loads(urllib.request.urlopen(base + "/telemetry", timeout=5).read())["state"] == "ok"
            except OSError:
                return False  # not listening yet

        wait_for(collected, 30, "a collection", agent)
        snap = json.loads(urllib.request.urlopen(base + "/telemetry", timeout=5).read())
        assert {s["name"] for s in snap["sensors"]} >= {"Inlet Temp", "FAN1"}
        assert "unavailable" in snap["power"] and "unavailable" in snap["power_limit"]
        assert snap["fru"]["Board product name"] == "SimBoard 1"
        with urllib.request.urlopen(base + "/metrics", timeout=5) as r:
            text = r.read().decode()
        assert r.status == 200 and 'ipmi_temperature_celsius{id="1",name="Inlet Temp"}' in text
        assert "ipmi_dcmi_power_consumption_current_watts" not in text
    finally:
        if agent is not None:
            agent.stop()
        sim.stop()


class _MalformedParts:
    """A backend whose DCMI and FRU replies are malformed: the sensors must survive them."""
    name = "ipmi"

    def __init__(self):
        self.fru_reads = 0

    def sensors(self):
        return [{"id": "1", "name": "Inlet Temp", "type": "temperature", "value": 30.0, "units": "°C",
                 "health": "ok", "states": [], "thresholds": {}}]

    def power(self):
        return dcmi.decode_reading(b"\x00\x01")  # a short reply

    def power_limit(self):
        raise BmcCommandFailed("Get Power Limit", 0xC1, "invalid command")

    def sel(self):
        return []

    def fru(self):
        self.fru_reads += 1
        raise IndexError("FRU area runs past its data")


def test_one_malformed_part_keeps_the_rest_and_an_unreadable_fru_is_asked_once():
    backend = _MalformedParts()
    c = Coordinator(backend, period_s=0.5, deadline_s=2.0)
    c.collect_once()
    c.collect_once()
    snap = c.view()
    assert snap["state"] == "ok" and snap["sensors"][0]["value"] == 30.0
    assert "unavailable" in snap["power"] and "0xc1" in snap["power_limit"]["unavailable"]
    assert "IndexError" in snap["fru"]["unavailable"] and backend.fru_reads == 1
    assert "ipmi_temperature_celsius" in metrics.render(snap)
