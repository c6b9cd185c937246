"""Where the box's status comes from (I/O): the serving API (over its own Unix socket, behind the front and
without a key, or a URL) and supervisord's programs. The status reader and the update's health gate both look
here."""

from __future__ import annotations

from pathlib import Path

from host_runtime.common import http_client
from host_runtime.common.supervisor_rpc import supervisor_proxy


def serving_get(path: str, timeout: float, *, socket: Path | None = None,
                url: str = "http://127.0.0.1:8080") -> http_client.Answer:
    """GET `path` from the serving API: its Unix socket when given, else `url`. Any status is an answer; OSError
    (http_client.HTTPFailure) when it does not answer."""
    if socket is not None:
        return http_client.unix_get(str(socket), path, timeout)
    return http_client.get(url + path, timeout=timeout)


def supervisor_programs(supervisor_socket: Path) -> dict[str, str]:
    """Every supervisord program's state by name (RUNNING, STARTING, FATAL, ...). Raises what xmlrpc or the socket
    raise when supervisord does not answer."""
    return {p["name"]: p["statename"] for p in supervisor_proxy(supervisor_socket).supervisor.getAllProcessInfo()}
