"""The box's supervisord, over its Unix socket (XML-RPC, supervisor's own transport): one place for the console,
the update's health gate and `everycycle models default`, none of which need the others' code."""

from __future__ import annotations

import xmlrpc.client
from pathlib import Path


def supervisor_proxy(socket_path: Path):
    from supervisor.xmlrpc import SupervisorTransport

    transport = SupervisorTransport(None, None, f"unix://{socket_path}")
    return xmlrpc.client.ServerProxy("http://127.0.0.1", transport=transport)


def restart_service(socket_path: Path, name: str) -> str:
    proxy = supervisor_proxy(socket_path)
    try:
        proxy.supervisor.stopProcess(name, True)
    except Exception:
        pass  # already stopped
    proxy.supervisor.startProcess(name, True)
    return f"restarted {name}"
