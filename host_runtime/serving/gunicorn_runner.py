"""Runs the falcon app under gunicorn, with the engine as the master's child process.

The engine (and so the model's weights) exists once, whatever the number of HTTP workers; workers reach it over
a Unix socket. If the engine dies, it is started again in place (the API stays up; its streams end with
engine_unavailable, and the model reloads); if it keeps dying, the master stops with a non-zero status
(engine_gave_up), so the supervisor restarts the pair as one service and monitoring sees a failure.
"""

from __future__ import annotations

import os
import signal

from gunicorn.app.base import BaseApplication

from host_runtime.pool.engine_child import EngineChild
from host_runtime.serving.app import AppConfig, create_app


class ServingApplication(BaseApplication):
    def __init__(self, app_config: AppConfig, *, bind: str | list[str], workers: int, threads: int,
                 engine: EngineChild | None, pool=None):
        self.app_config = app_config
        self.bind = bind
        self.workers = workers
        self.threads = threads
        self.engine = engine
        self.pool = pool  # pool.pool.EnginePool: the store's other models, loaded on demand
        self.engine_gave_up = False  # its engine kept dying: serve exits non-zero
        super().__init__()

    def load_config(self) -> None:
        engine, pool = self.engine, self.pool

        def give_up():
            self.engine_gave_up = True
            os.kill(os.getpid(), signal.SIGTERM)

        def on_starting(server):
            if engine is not None:
                # The model the server started with: restarted in place when it crashes, a few times.
                engine.keep(give_up)
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
