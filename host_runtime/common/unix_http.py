"""HTTP over a Unix socket: how the box's own readers (console, status, boot check) reach the serving API
directly, behind the front and without a key (the socket's directory admits only the box's services)."""

from __future__ import annotations

import http.client
import socket


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


def unix_get(socket_path: str, path: str, timeout: float) -> tuple[int, bytes]:
    """GET `path`; (status, body) for every status. OSError when the socket does not answer."""
    conn = _UnixConnection(socket_path, timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    except http.client.HTTPException as exc:
        raise OSError(f"bad HTTP answer on {socket_path}: {exc}") from None
    finally:
        conn.close()
