"""A free loopback TCP port, for a hop that never leaves the box (the RPC server behind a member's tunnel, each
member's end of the holder's)."""

from __future__ import annotations

import socket


def free_loopback_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
