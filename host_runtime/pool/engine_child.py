"""An engine process (`everycycle engine`) for one model, started by the server for its default model and by the
pool for the others: its settings (engine/options.EngineOptions) go to it as themselves on its stdin."""

from __future__ import annotations

import ctypes
import logging
import signal
import subprocess
import sys
import threading

from host_runtime.common.processes import stop_process

log = logging.getLogger("everycycle.serve")
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    # The engine must not outlive a master killed with SIGKILL: it would hold the model and the socket.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class EngineChild:
    """An engine process (`everycycle engine`) for one model, its settings (engine/options.EngineOptions) given
    to it as themselves on its stdin."""

    def __init__(self, socket_path: str, options):
        self.socket_path = socket_path
        self.options = options
        self.argv = [sys.executable, "-m", "host_runtime.cli", "engine", "--socket", socket_path, "--options-stdin"]
        self.proc: subprocess.Popen | None = None
        self.stopping = False

    def start(self, on_unexpected_exit) -> None:
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE, preexec_fn=_die_with_parent)
        try:
            self.proc.stdin.write(self.options.to_json().encode())
            self.proc.stdin.close()
        except OSError as exc:  # it died before reading: its exit code says why, the watcher reports it
            log.error("the engine (pid %d) did not take its settings: %s", self.proc.pid, exc)
        log.info("engine started (pid %d) for %s", self.proc.pid, self.options.model)

        def watch():
            code = self.proc.wait()
            if not self.stopping:
                log.error("the engine (pid %d) exited unexpectedly (code %s)", self.proc.pid, code)
                on_unexpected_exit()

        threading.Thread(target=watch, name="engine-watch", daemon=True).start()

    def stop(self) -> None:
        self.stopping = True
        if self.proc:
            stop_process(self.proc, 10)
