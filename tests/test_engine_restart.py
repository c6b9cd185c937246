"""The server's own engine crashing (#55): restarted in place while the API stays up, and a serve whose engine
keeps crashing exits non-zero, for its supervisor and monitoring (it exited 0 before: gunicorn's master reaps
every child, so the engine's status was lost, and the master stopped itself by SIGTERM)."""

from __future__ import annotations

import json
import os
import signal
import time

import psutil
import pytest

from host_runtime.pool.engine_child import CrashBudget
from tests.servers import http_get, ready, running_serve, wait_for

pytestmark = pytest.mark.system


def test_the_crash_budget_restarts_three_crashes_a_minute_and_not_a_fourth():
    budget = CrashBudget(restarts=3, window_s=60)
    assert [budget.restart(t) for t in (0, 10, 20)] == [True, True, True]
    assert budget.restart(30) is False
    assert CrashBudget(restarts=3, window_s=60).restart(0) is True
    spaced = CrashBudget(restarts=3, window_s=60)
    assert all(spaced.restart(t) for t in range(0, 1000, 61))  # one a minute, for ever: each restarted



def test_the_watchdog_outlives_a_failed_check_and_kills_an_engine_that_falls_silent(tmp_path, monkeypatch):
    """A check that raised anything but EngineUnavailable ended the watchdog's thread, and an engine that then
    fell silent was never recycled (a full make test once waited 60 s for it)."""
    import subprocess
    import threading

    from host_runtime.engine.errors import RequestRejected
    from host_runtime.engine.ipc import EngineUnavailable
    from host_runtime.pool import engine_child

    answers = iter([None, ValueError("a bug in the check"), RequestRejected(503, "an error in answer"), None])

    def info(self, timeout=None):
        answer = next(answers, EngineUnavailable("silent"))
        if answer is not None:
            raise answer

    monkeypatch.setattr(engine_child.EngineClient, "info", info)
    monkeypatch.setattr(engine_child, "WATCH_EVERY_S", 0.05)
    child = engine_child.EngineChild(str(tmp_path / "engine.sock"), None, wedged_after_s=0.5)
    proc = subprocess.Popen(["sleep", "60"])
    try:
        watchdog = threading.Thread(target=child._watch, args=(proc,))
        started = time.monotonic()
        watchdog.start()
        watchdog.join(timeout=10)
        assert not watchdog.is_alive() and proc.wait(timeout=5) == -signal.SIGKILL
        assert time.monotonic() - started >= 0.5  # silent for wedged_after_s after its last answer, not before
    finally:
        proc.kill()
        proc.wait()

def engine_pid(serve_pid: int) -> int | None:
    """The serve process's live engine (not a killed one not yet reaped)."""
    for child in psutil.Process(serve_pid).children():
        try:
            if child.status() != psutil.STATUS_ZOMBIE and "engine" in child.cmdline():
                return child.pid
        except psutil.Error:
            continue
    return None


def answer(base: str) -> dict:
    import urllib.request

    body = json.dumps({"model": "SmolLM2-135M-Instruct.Q4_1", "max_tokens": 4,
                       "messages": [{"role": "user", "content": "hi"}]}).encode()
    req = urllib.request.Request(base + "/v1/chat/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def test_a_killed_engine_is_restarted_in_place_and_one_that_keeps_dying_stops_serve_non_zero(tmp_path):
    with running_serve(["--ctx-size", "512", "--parallel", "1"], tmp_path, "serve") as (base, proc):
        first = engine_pid(proc.popen.pid)
        os.kill(first, signal.SIGKILL)
        wait_for(lambda: engine_pid(proc.popen.pid) not in (None, first) and ready(base), 120,
                 "the engine started again", proc)
        assert proc.popen.poll() is None  # the API stayed up
        assert answer(base)["choices"][0]["message"]["content"] is not None
        assert http_get(base + "/health")[0] == 200
        # three more crashes in a minute: the fourth in the window stops serve, with a failure status
        for _ in range(3):
            pid = wait_for(lambda: engine_pid(proc.popen.pid), 60, "an engine", proc)
            os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and engine_pid(proc.popen.pid) == pid:
                time.sleep(0.1)
        assert proc.popen.wait(timeout=60) == 1
        assert "stopping" in proc.log()


def test_a_stopped_engine_is_seen_within_ready_wait_ends_its_streams_and_is_started_again(tmp_path):
    """SIGSTOP (#55): /ready probes took 5 s where --ready-wait said 2, streams got no byte, and nothing recycled
    the engine. Now: /ready within --ready-wait, the keeper kills an engine silent past --wedge-floor and starts it
    again, and the stream it held ends with an error event."""
    import http.client
    import threading

    from tests.test_contention import END_TOKENS

    with running_serve(["--ctx-size", "1024", "--parallel", "1", "--wedge-floor", "3", "--ready-wait", "1"],
                       tmp_path, "serve") as (base, proc):
        first = engine_pid(proc.popen.pid)
        lines: list[bytes] = []

        def stream():
            conn = http.client.HTTPConnection("127.0.0.1", int(base.rsplit(":", 1)[1]), timeout=120)
            conn.request("POST", "/v1/chat/completions", body=json.dumps({
                "model": "SmolLM2-135M-Instruct.Q4_1", "max_tokens": 900, "stream": True, "logit_bias": END_TOKENS,
                "messages": [{"role": "user", "content": "Tell a long story."}]}),
                headers={"Content-Type": "application/json"})
            for line in conn.getresponse():
                lines.append(line)

        reader = threading.Thread(target=stream)
        reader.start()
        wait_for(lambda: sum(line.startswith(b"data: {") for line in lines) > 5, 60, "the stream's first tokens")
        os.kill(first, signal.SIGSTOP)
        try:
            time.sleep(0.5)
            started = time.monotonic()
            status = http_get(base + "/ready", timeout=10)[0]
            assert time.monotonic() - started < 1.0 + 0.5 and status in (200, 503)
            wait_for(lambda: engine_pid(proc.popen.pid) not in (None, first) and ready(base), 60,
                     "the engine killed and started again", proc)
        finally:
            try:
                os.kill(first, signal.SIGCONT)
            except ProcessLookupError:
                pass
        reader.join(timeout=60)
        assert not reader.is_alive()
        events = [line for line in lines if line.startswith(b"data: {")]
        assert b"error" in events[-1], events[-1]
        assert "wedged; killing it" in proc.log()
        assert answer(base)["choices"][0]["message"]["content"] is not None


def test_a_second_serve_on_the_same_run_dir_is_refused_and_the_first_keeps_its_engine(tmp_path):
    """Two serves on one --run-dir bound one engine socket: the first's workers then talked to the second's engine,
    and when either stopped the other lost its engine (an orphaned engine was left spinning)."""
    import subprocess

    from tests.servers import everycycle, free_port

    with running_serve(["--ctx-size", "1024", "--parallel", "1"], tmp_path, "serve") as (base, proc):
        first = engine_pid(proc.popen.pid)
        second = subprocess.run(everycycle("serve", "--port", str(free_port()), "--run-dir", str(tmp_path),
                                           "--ctx-size", "1024", "--parallel", "1"),
                                capture_output=True, text=True, timeout=120)
        assert second.returncode == 2
        assert f"--run-dir {tmp_path} is in use by another process (pid {proc.popen.pid})" in second.stderr
        assert "give each serve its own --run-dir" in second.stderr and "Traceback" not in second.stderr
        assert http_get(base + "/v1/models")[0] == 200 and engine_pid(proc.popen.pid) == first and ready(base)
    # the lock goes with its serve: the folder serves again
    with running_serve(["--ctx-size", "1024", "--parallel", "1"], tmp_path, "serve again") as (base, _):
        assert ready(base)
