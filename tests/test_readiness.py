"""/health is liveness; /ready is a real canary generation, shared by every probe: 503 until the first passes and
when the engine is wedged (no progress past a bound derived from its measured calls), 200 when slow but progressing."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from tests.servers import Proc, everycycle, free_port, http_get, wait_for

pytestmark = pytest.mark.system  # every test here starts processes or loads the model


@pytest.fixture
def split_server(tmp_path):
    """The HTTP front end started first, pointed at an engine socket nobody serves yet."""
    sock = str(tmp_path / "engine.sock")
    port = free_port()
    front = Proc(everycycle("serve", "--port", str(port), "--engine-socket", sock, "--ready-wait", "1",
                            "--workers", "1"), tmp_path / "front.log")
    base = f"http://127.0.0.1:{port}"
    procs = [front]
    try:
        wait_for(lambda: _status(base + "/health") == 200, 30, "the front end", front)
        yield base, sock, tmp_path, procs
    finally:
        for p in procs:
            p.stop()


def _status(url: str) -> int | None:
    try:
        return http_get(url, timeout=10)[0]
    except OSError:
        return None


def _ready(base: str) -> tuple[int, dict]:
    status, body = http_get(base + "/ready", timeout=15)
    return status, json.loads(body)


def _engine(sock: str, tmp, *extra: str, env: dict | None = None) -> Proc:
    return Proc(everycycle("engine", "--socket", sock, "--threads", "2", "--ctx-size", "512", "--parallel", "1",
                           *extra), tmp / "engine.log", env=env)


def _counter(base: str, name: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    text = http_get(base + "/metrics")[1].decode()
    return next(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name)


def test_ready_follows_the_engine_and_a_stopped_engine_is_wedged_within_its_bound(split_server):
    base, sock, tmp, procs = split_server
    status, doc = _ready(base)
    assert status == 503 and doc["status"] == "not_ready" and doc["state"] == "unreachable"
    health = json.loads(http_get(base + "/health")[1])
    assert {k: health[k] for k in ("status", "engine")} == {"status": "ok", "engine": "unreachable"}
    # Off the box image, the system's version and slot say why they cannot be read.
    assert health["system"]["version"].startswith("unavailable: no IMAGE_VERSION")
    assert health["system"]["slot"].startswith("unavailable") and health["system"]["last_update"] is None

    engine = _engine(sock, tmp, "--wedge-floor", "3")
    procs.append(engine)
    wait_for(lambda: _status(base + "/ready") == 200, 60, "the canary to pass", engine)
    status, doc = _ready(base)
    # The bound is the floor (3 s) unless the slowest call seen, ten times over, is longer: this model's calls
    # take milliseconds on an idle machine, but a loaded one (a CI run beside other work) saw a 4.4 s warm-up.
    # (busy: a canary's call in flight may count for more.)
    floor_or_calls = max(3.0, round(10 * doc["slowest_step_s"], 3))
    assert doc["state"] in ("ready", "busy") and doc["canary_s"] > 0
    assert doc["bound_s"] == floor_or_calls if doc["state"] == "ready" else doc["bound_s"] >= floor_or_calls
    bound = doc["bound_s"]
    assert "warm-up decode" in engine.log()

    # Wedged: the whole engine stops (its socket too). Liveness still answers; readiness says wedged once the
    # engine has been silent past the bound it reported.
    os.kill(engine.popen.pid, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        wait_for(lambda: _ready(base)[1]["state"] == "wedged", 20 + bound, "/ready to report the stopped engine wedged")
        # One probe may be in flight when the bound passes: it gives up after --ready-wait + 3 s.
        assert time.monotonic() - stopped < bound + 4.0 + 2.0
        status, doc = _ready(base)
        assert status == 503 and doc["reason"].startswith("wedged: the engine has not answered")
        assert _status(base + "/health") == 200
    finally:
        os.kill(engine.popen.pid, signal.SIGCONT)
    wait_for(lambda: _status(base + "/ready") == 200, 30, "/ready to recover")


def test_a_slow_canary_makes_the_box_ready_and_probes_never_start_a_second(split_server):
    """Every decode call takes 6 s more (a test hook): the canary (a prompt call and a decode call) takes over
    12 s, longer than the 10 s that used to count as wedged and than a probe waits. Probes share it instead of
    cancelling it and starting another."""
    base, sock, tmp, procs = split_server
    engine = _engine(sock, tmp, env={**os.environ, "EVERYCYCLE_TEST_DECODE_DELAY_S": "6"})
    procs.append(engine)
    seen = []

    def probe():
        status, doc = _ready(base)
        seen.append((status, doc["state"]))
        return status == 200

    started = time.monotonic()
    wait_for(probe, 120, "the slow canary to pass", engine)
    states = [s for _, s in seen]
    assert "starting" in states and states[-1] == "ready", seen
    assert _counter(base, "everycycle_requests_total") == 1  # one canary, however many probes
    assert _counter(base, "everycycle_requests_cancelled_total") == 0
    assert _counter(base, "everycycle_canaries_total") == 1
    assert _counter(base, "everycycle_canary_seconds") >= 12.0
    assert time.monotonic() - started >= 12.0
    # The next canary (the last is older than 5 s) runs while probes answer "busy but progressing": 200.
    time.sleep(5.5)
    status, doc = _ready(base)
    assert (status, doc["state"]) == (200, "busy") and "busy but progressing" in doc["reason"], doc
    wait_for(lambda: _counter(base, "everycycle_canaries_total") == 2, 30, "the second canary")
    assert _counter(base, "everycycle_requests_total") == 2


def test_serve_refuses_a_model_that_is_not_gguf(tmp_path):
    bogus = tmp_path / "model.gguf"
    bogus.write_bytes(b"not a model at all")
    import subprocess

    out = subprocess.run(everycycle("serve", "--model", str(bogus), "--port", "0"), capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2
    assert "--model" in out.stderr and "not a GGUF" in out.stderr
    assert "Traceback" not in out.stderr
