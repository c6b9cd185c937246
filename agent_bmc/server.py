"""Runs the coordinator and its endpoint under gunicorn: one worker process owns the single collector."""

from __future__ import annotations

import threading

from gunicorn.app.base import BaseApplication

from agent_bmc.http_app import create_app


class AgentApplication(BaseApplication):
    def __init__(self, coordinator, listen: str):
        self.coordinator = coordinator
        self.listen = listen
        super().__init__()

    def load_config(self) -> None:
        coordinator = self.coordinator

        def post_worker_init(worker):
            threading.Thread(target=coordinator.run, name="bmc-coordinator", daemon=True).start()

        for key, value in {"bind": self.listen, "workers": 1, "worker_class": "gthread", "threads": 4,
                           "timeout": 30, "graceful_timeout": 5, "accesslog": None, "errorlog": "-",
                           "loglevel": "warning", "proc_name": "everycycle-bmc", "control_socket_disable": True,
                           "post_worker_init": post_worker_init}.items():
            self.cfg.set(key, value)

    def load(self):
        return create_app(self.coordinator)
