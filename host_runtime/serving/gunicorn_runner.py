"""Runs the falcon app under gunicorn, with the engine as the master's child process.

The engine (and so the model's weights) exists once, whatever the number of
HTTP workers; workers reach it over a Unix socket. If the engine dies, the
master shuts down too, so the supervisor restarts the pair as one service.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading

from gunicorn.app.base import BaseApplication

from host_runtime.common.processes import stop_process
from host_runtime.serving.app import AppConfig, create_app

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


class ServingApplication(BaseApplication):
    def __init__(self, app_config: AppConfig, *, bind: str | list[str], workers: int, threads: int,
                 engine: EngineChild | None, pool=None):
        self.app_config = app_config
        self.bind = bind
        self.workers = workers
        self.threads = threads
        self.engine = engine
        self.pool = pool  # engine_pool.EnginePool: the store's other models, loaded on demand
        super().__init__()

    def load_config(self) -> None:
        engine, pool = self.engine, self.pool

        def on_starting(server):
            if engine is not None:
                # The model the server started with: without its engine the server stops, and supervisord
                # restarts the pair.
                engine.start(lambda: os.kill(os.getpid(), signal.SIGTERM))
            if pool is not None:
                pool.start()

        def on_exit(server):
            if pool is not None:
                pool.stop()
            if engine is not None:
                engine.stop()

        settings = {
            "bind": self.bind,
            "workers": self.workers,
            "worker_class": "gthread",
            "threads": self.threads,  # each streaming request holds a thread for its whole life
            "timeout": 60,
            "graceful_timeout": 10,
            "keepalive": 5,
            "accesslog": "-",
            "errorlog": "-",
            "loglevel": "info",
            "proc_name": "everycycle-serve",
            "control_socket_disable": True,  # supervisord manages us; a shared ~/.gunicorn socket would collide
            "on_starting": on_starting,
            "on_exit": on_exit,
        }
        for key, value in settings.items():
            self.cfg.set(key, value)

    def load(self):
        return create_app(self.app_config)
