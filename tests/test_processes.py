"""host_runtime.common.processes.stop_process: ask, wait, then kill, and always reap."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from host_runtime.common.processes import stop_process

pytestmark = pytest.mark.system  # every test here starts processes or loads the model


def test_a_process_that_obeys_sigterm_stops_in_time():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    took = stop_process(proc, 10)
    assert took is not None and took < 10 and proc.returncode is not None


def test_a_process_that_ignores_sigterm_is_killed_and_reaped():
    proc = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                             "print('ready', flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    assert stop_process(proc, 0.5) is None
    assert proc.returncode == -9


def test_group_reaches_the_grandchildren_and_ask_replaces_sigterm(tmp_path):
    pidfile = tmp_path / "child.pid"
    proc = subprocess.Popen(["sh", "-c", f"sleep 60 & echo $! > {pidfile}; wait"], start_new_session=True)
    while not pidfile.exists() or not pidfile.read_text().strip():
        time.sleep(0.05)
    child = int(pidfile.read_text())
    assert stop_process(proc, 10, group=True) is not None
    time.sleep(0.2)
    assert not os.path.exists(f"/proc/{child}") or "Z" in open(f"/proc/{child}/stat").read().split()[2]
    asked = []
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    assert stop_process(proc, 0.5, ask=lambda: asked.append(True)) is None  # asked nicely, ignored, then killed
    assert asked == [True] and proc.returncode == -9
    assert stop_process(proc, 1) is None  # already gone: nothing to do
