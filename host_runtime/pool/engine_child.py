"""An engine process (`everycycle engine`) for one model, started by the server for its default model and by the
pool for the others: its settings (engine/options.EngineOptions) go to it as themselves on its stdin."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque

from host_runtime.common.errors import EveryCycleError
from host_runtime.common.processes import die_with_parent, stop_process
from host_runtime.engine.client import EngineClient
from host_runtime.engine.ipc import EngineUnavailable

log = logging.getLogger("everycycle.serve")
RESTARTS = 3        # crashes of the server's own engine restarted in place within RESTART_WINDOW_S; the next stops
RESTART_WINDOW_S = 60.0  # serve (non-zero), for its supervisor to act on: a model that dies at every load
RESTART_DELAY_S = 1.0
ASKED_STOP_GRACE_S = 15.0  # an engine ended by SIGTERM waits this long for serve's own stop (gunicorn's graceful
                           # timeout is 10 s) before it counts as a crash and is started again
WATCH_EVERY_S = 2.0  # how often the keeper asks the engine it keeps whether it answers


class CrashBudget:
    """Pure: whether an engine that crashed at `now` (monotonic seconds) is restarted in place."""

    def __init__(self, restarts: int = RESTARTS, window_s: float = RESTART_WINDOW_S):
        self.restarts, self.window_s = restarts, window_s
        self._crashes: deque[float] = deque()

    def restart(self, now: float) -> bool:
        self._crashes.append(now)
        while self._crashes and self._crashes[0] < now - self.window_s:
            self._crashes.popleft()
        return len(self._crashes) <= self.restarts


class EngineChild:
    """An engine process (`everycycle engine`) for one model, its settings (engine/options.EngineOptions) given
    to it as themselves on its stdin."""

    def __init__(self, socket_path: str, options, wedged_after_s: float | None = None):
        """wedged_after_s: where the engine is kept (keep), one that has answered and then answers nothing for
        this long is killed and started again (its IPC threads answer even during a long llama.cpp call, so
        silence is a stopped or deadlocked process); None: never."""
        self.socket_path = socket_path
        self.wedged_after_s = wedged_after_s
        self.options = options
        self.argv = [sys.executable, "-m", "host_runtime.cli", "engine", "--socket", socket_path, "--options-stdin"]
        self.proc: subprocess.Popen | None = None
        self.stopping = False

    def start(self, on_unexpected_exit, watch: bool = True) -> None:
        # The settings in an unlinked file, not a pipe: a pipe's write end, open while gunicorn forks a worker
        # (it does from another thread than this), stays open in the worker, and the engine never reads its end.
        with tempfile.TemporaryFile() as settings:
            settings.write(self.options.to_json().encode())
            settings.seek(0)
            self.proc = subprocess.Popen(self.argv, stdin=settings, preexec_fn=die_with_parent)
        log.info("engine started (pid %d) for %s", self.proc.pid, self.options.model)

        def watch_exit():
            code = self.proc.wait()
            if not self.stopping:
                log.error("the engine (pid %d) exited unexpectedly (code %s)", self.proc.pid, code)
                on_unexpected_exit()

        if watch:
            threading.Thread(target=watch_exit, name="engine-watch", daemon=True).start()

    def keep(self, on_give_up, budget: CrashBudget | None = None) -> None:
        """Start the engine and restart it in place whenever it dies unasked, while `budget` allows; then
        on_give_up(). One thread starts, waits and restarts: an engine dies with the thread that started it
        (PR_SET_PDEATHSIG). An unasked exit is a crash whatever its status: the engine never ends on its own, and
        gunicorn's master reaps every child, so the status read here may be 0 (ECHILD)."""
        budget = budget or CrashBudget()

        def keeper():
            while True:
                self.start(lambda: None, watch=False)
                if self.wedged_after_s:
                    threading.Thread(target=self._watch, args=(self.proc,), name="engine-watchdog",
                                     daemon=True).start()
                code = self.proc.wait()
                if code in (-signal.SIGTERM, -signal.SIGINT, 128 + signal.SIGTERM, 128 + signal.SIGINT):
                    # Told to stop from outside: the whole service is stopping (its process group got the signal
                    # before gunicorn's exit hook marks the engine stopping); restarted only if serve goes on.
                    deadline = time.monotonic() + ASKED_STOP_GRACE_S
                    while not self.stopping and time.monotonic() < deadline:
                        time.sleep(0.1)
                if self.stopping:
                    return
                if not budget.restart(time.monotonic()):
                    log.error("the engine (pid %d) exited unexpectedly (code %s), its %d-th crash in %.0f s: "
                              "stopping", self.proc.pid, code, budget.restarts + 1, budget.window_s)
                    on_give_up()
                    return
                log.error("the engine (pid %d) exited unexpectedly (code %s): starting it again in %.0f s, the "
                          "model reloads", self.proc.pid, code, RESTART_DELAY_S)
                time.sleep(RESTART_DELAY_S)
                if self.stopping:
                    return

        threading.Thread(target=keeper, name="engine-keeper", daemon=True).start()

    def _watch(self, proc: subprocess.Popen) -> None:
        """Kill `proc` (the keeper then starts it again) once it has answered and then stays silent for
        wedged_after_s (#55: an engine stopped for 22 s held its streams, and nothing recycled it)."""
        answered_at = None  # the last answer; before the first, when its socket was first there to ask
        while proc.poll() is None and not self.stopping:
            try:
                EngineClient(self.socket_path).info(timeout=WATCH_EVERY_S)
                answered_at = time.monotonic()
            except EngineUnavailable:
                if answered_at is None and os.path.exists(self.socket_path):
                    answered_at = time.monotonic()  # stopped before its first answer counts too
                if answered_at is not None and time.monotonic() - answered_at > self.wedged_after_s:
                    log.error("the engine (pid %d) has answered nothing for %.0f s: wedged; killing it to start it "
                              "again", proc.pid, time.monotonic() - answered_at)
                    proc.kill()
                    return
            except EveryCycleError:  # an error in answer is an answer: not wedged
                answered_at = time.monotonic()
            except Exception:  # noqa: BLE001 - a check that fails says nothing of the engine; the watchdog goes on
                log.exception("the engine watchdog's check failed; checking again")
            time.sleep(WATCH_EVERY_S)

    def stop(self) -> None:
        self.stopping = True
        if self.proc:
            stop_process(self.proc, 10)
