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
        wait_for(lambda: (p := engine_pid(proc.popen.pid)) not in (None, first) and ready(base), 120,
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
