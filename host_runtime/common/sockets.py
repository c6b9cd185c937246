"""Whether the other end of a connection hung up: one check for the engine (its worker left) and the HTTP
workers (their client left), so a request nobody waits for is cancelled instead of run to the end."""

from __future__ import annotations

import select
import socket


def peer_closed(sock: socket.socket) -> bool:
    """True once the peer has closed (or the socket broke). Never blocks; data waiting to be read is not a close."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        if not readable:
            return False
        return sock.recv(1, socket.MSG_PEEK) == b""
    except (OSError, ValueError):
        return True
