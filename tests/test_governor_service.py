"""The governor service: observe vs enforce, restoring defaults, fail-safe, publishing, and the scheduler's hint."""

from __future__ import annotations

import json
import os
import queue
import signal
import time

import pytest

from host_runtime.governor.backends import GpuInfo, GpuReading
from host_runtime.gpu.nvml import reasons_mean_slowdown as nvml_reasons_mean_slowdown
from host_runtime.governor.control import GpuLimits, PowerPolicy
from host_runtime.governor.service import Governor
from tests.conftest import _nvml_works
from tests.servers import Proc, everycycle, wait_for

LIMITS = GpuLimits(100.0, 350.0, 350.0)


class ScriptedBackend:
    """Test equipment: readings the test sets, and a record of every limit written."""

    name = "scripted"

    def __init__(self, gpus=("gpu-0",)):
        self.ids = list(gpus)
        self.temperature = {g: 60.0 for g in self.ids}
        self.limit = {g: 350.0 for g in self.ids}
        self.writes: list[tuple[str, float]] = []

    def gpus(self):
        return [GpuInfo(g, g, LIMITS) for g in self.ids]

    def read(self):
        return [GpuReading(g, self.temperature[g], 200.0, self.limit[g], False, time.monotonic()) for g in self.ids]

    def set_limit(self, gpu_id, watts):
        self.writes.append((gpu_id, watts))
        self.limit[gpu_id] = watts


def heat(gov: Governor, backend: ScriptedBackend, celsius: float, ticks: int) -> None:
    for g in backend.ids:
        backend.temperature[g] = celsius
    for _ in range(ticks):
        gov.tick(1.0)


def test_observe_mode_decides_and_publishes_but_never_writes(tmp_path):
    backend = ScriptedBackend()
    gov = Governor(backend, PowerPolicy(), mode="observe", state_path=tmp_path / "governor.json")
    heat(gov, backend, 84.0, 20)
    assert backend.writes == []
    state = json.loads((tmp_path / "governor.json").read_text())
    (g,) = state["gpus"]
    assert state["mode"] == "observe" and g["state"] == "controlling"
    assert g["decided_limit_w"] < 300 and g["applied_limit_w"] == 350.0  # what it would set vs what the card has
    prom = (tmp_path / "governor.prom").read_text()
    assert 'everycycle_governor_decided_limit_watts{gpu="gpu-0"}' in prom
    assert 'everycycle_governor_state{gpu="gpu-0",state="controlling"} 1' in prom
    assert any(e["event"] == "controlling" for e in state["events"])


def test_enforce_writes_limits_records_them_and_restores_defaults(tmp_path):
    backend = ScriptedBackend(["a", "b"])
    gov = Governor(backend, PowerPolicy(), mode="enforce", state_path=tmp_path / "governor.json")
    heat(gov, backend, 84.0, 20)
    assert backend.limit["a"] < 300 and backend.limit["b"] < 300
    assert json.loads((tmp_path / "governor-restore.json").read_text()) == {"gpus": ["a", "b"]}
    gov.restore_defaults()
    assert backend.limit == {"a": 350.0, "b": 350.0}
    assert not (tmp_path / "governor-restore.json").exists()


def test_a_restart_after_a_crash_restores_what_the_last_run_changed(tmp_path):
    (tmp_path / "governor-restore.json").write_text(json.dumps({"gpus": ["a"]}))
    backend = ScriptedBackend(["a", "b"])
    backend.limit["a"] = 120.0  # left low by a governor that died
    gov = Governor(backend, PowerPolicy(), mode="enforce", state_path=tmp_path / "governor.json")
    gov.restore_after_crash()
    assert backend.writes == [("a", 350.0)]
    assert not (tmp_path / "governor-restore.json").exists()
    assert gov.events[0]["event"] == "restored"


def test_lost_telemetry_goes_to_the_safe_limit_and_throttles(tmp_path):
    backend = ScriptedBackend()
    clock = [1000.0]  # injected: the test moves time instead of sleeping for it
    gov = Governor(backend, PowerPolicy(), mode="enforce", state_path=tmp_path / "governor.json",
                   clock=lambda: clock[0])
    heat(gov, backend, 70.0, 2)
    backend.temperature["gpu-0"] = None
    clock[0] += 1.0
    gov.tick(1.0)
    state = json.loads((tmp_path / "governor.json").read_text())
    assert state["gpus"][0]["state"] == "failsafe" and backend.limit["gpu-0"] == 225.0
    assert state["throttle_level"] == 2


def test_nvml_slowdown_reasons():
    assert nvml_reasons_mean_slowdown(0x40) and nvml_reasons_mean_slowdown(0x8) and nvml_reasons_mean_slowdown(0x80)
    assert not nvml_reasons_mean_slowdown(0x1 | 0x4)  # idle, software power cap: not the hardware protecting itself


@pytest.mark.system
def test_the_service_runs_on_the_simulator_and_restores_on_sigterm(tmp_path):
    state = tmp_path / "governor.json"
    proc = Proc(everycycle("governor", "run", "--backend", "simulator", "--sim-gpus", "2", "--sim-speed", "60",
                           "--tick", "0.1", "--state", str(state)), tmp_path / "governor.log")
    try:
        def controlling():
            try:
                doc = json.loads(state.read_text())
            except (OSError, ValueError):
                return False
            return all(g["state"] == "controlling" for g in doc["gpus"]) and doc["backend"] == "simulator"

        wait_for(controlling, 30, "the simulated GPUs to heat up into control", proc)
        doc = json.loads(state.read_text())
        assert all(g["applied_limit_w"] <= 350 for g in doc["gpus"]) and doc["mode"] == "enforce"
        os.kill(proc.popen.pid, signal.SIGTERM)
        assert proc.popen.wait(timeout=15) == 0
        final = json.loads(state.read_text())
        assert all(g["applied_limit_w"] == g["default_w"] for g in final["gpus"])
        assert final["events"][0]["event"] == "restored"
    finally:
        proc.stop()


@pytest.mark.skipif(_nvml_works(), reason="NVML works here: this checks the path of a box without it")
def test_an_unusable_backend_is_a_clear_error(tmp_path):
    import subprocess

    out = subprocess.run(everycycle("governor", "run", "--backend", "nvml", "--state", str(tmp_path / "g.json")),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--backend nvml" in out.stderr and "Traceback" not in out.stderr


def test_auto_picks_the_backend_this_box_has(tmp_path):
    # The image's default. With NVML it must choose NVML; on a box with no readable GPU it idles on "none".
    from host_runtime.governor.backends import detect_backend

    backend, passed_over = detect_backend()
    if _nvml_works():
        assert backend.name == "nvml" and backend.gpus()
    else:
        assert backend.name in ("amdgpu", "none")
        assert any(why.startswith("nvml: ") for why in passed_over)
    state = tmp_path / "g.json"
    proc = Proc(everycycle("governor", "run", "--backend", "auto", "--state", str(state), "--tick", "0.2"), tmp_path / "gov.log")
    try:
        wait_for(lambda: state.exists(), 30, "the governor's first state")
        published = json.loads(state.read_text())
        assert published["backend"] == backend.name and published["mode"] == "observe"
        assert len(published["gpus"]) == len(backend.gpus())
        assert proc.popen.poll() is None
    finally:
        proc.stop()


@pytest.mark.system
def test_the_scheduler_follows_the_throttle_level(tmp_path):
    from host_runtime.engine.engine import Engine, GenerationRequest
    from host_runtime.engine.model import ContextConfig, LoadedModel, default_model_path
    from host_runtime.engine.sampling import SamplingParams

    hint = tmp_path / "governor.json"
    hint.write_text(json.dumps({"throttle_level": 2, "updated_unix": time.time()}))
    model = LoadedModel(default_model_path(), ContextConfig(n_ctx_per_seq=512, n_parallel=3, n_threads=2))
    engine = Engine(model, governor_state=str(hint))
    events: queue.Queue = queue.Queue()
    for name in "abc":
        engine.submit(GenerationRequest(prompt_tokens=model.tokenize("1, 2, 3,", add_bos=False, special=False),
                                        max_tokens=6, sink=lambda e, n=name: events.put((n, e.type)),
                                        sampling=SamplingParams(temperature=0.0, ignore_eos=True)))
    engine.start()
    order = []
    while len([1 for _, t in order if t == "done"]) < 3:
        order.append(events.get(timeout=60))
    engine.stop()
    # One sequence at a time: every request's tokens come after the previous one finished.
    names = [n for n, t in order if t == "token"]
    assert names == sorted(names)
    text = engine.metrics.render("m", "ready")
    assert 'everycycle_governor_throttle_level{model="m"} 2' in text and 'everycycle_sequences_allowed{model="m"} 1' in text
    # A stale hint (the governor stopped publishing) is ignored.
    hint.write_text(json.dumps({"throttle_level": 2, "updated_unix": time.time() - 3600}))
    assert engine.throttle.level() == 0
