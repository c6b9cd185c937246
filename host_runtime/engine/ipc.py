"""Framing between HTTP workers and the engine process: one JSON object per line over a Unix socket.

One connection carries one call. For a generation the engine streams events on
it; the worker closing the connection is how a request is cancelled.
"""

from __future__ import annotations

import json
import select
import socket
import time
from collections.abc import Callable
from typing import Iterator

CLIENT_POLL_S = 0.1  # while waiting for the engine, how often to ask whether the HTTP client is still there


class EngineUnavailable(Exception):
    """The engine process is not listening, or did not answer in time."""


class ClientGone(Exception):
    """The HTTP client hung up while its request waited for the engine; the engine call was closed (cancelled)."""


def send_message(sock: socket.socket, message: dict) -> None:
    sock.sendall(json.dumps(message, separators=(",", ":")).encode() + b"\n")


class LineReader:
    def __init__(self, sock: socket.socket):
        self._file = sock.makefile("rb")

    def read(self) -> dict | None:
        line = self._file.readline()
        if not line:
            return None
        return json.loads(line)


class EngineClient:
    """Used by HTTP workers. Every call opens its own connection, so calls never share state."""

    def __init__(self, socket_path: str, timeout: float = 10.0):
        self.socket_path = socket_path
        self.timeout = timeout

    def _connect(self, timeout: float) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(self.socket_path)
        except OSError as exc:
            sock.close()
            raise EngineUnavailable(f"the engine is not reachable at {self.socket_path}: {exc.strerror or exc}") from None
        return sock

    def call(self, message: dict, timeout: float | None = None,
             client_gone: Callable[[], bool] | None = None) -> dict:
        """One request, one reply. With `client_gone`, a client that leaves first closes the call (ClientGone)."""
        timeout = self.timeout if timeout is None else timeout
        with self.stream(message, timeout, timeout, client_gone) as reply:
            return reply.next_event()

    def stream(self, message: dict, first_event_timeout: float, idle_timeout: float,
               client_gone: Callable[[], bool] | None = None) -> "EventStream":
        sock = self._connect(first_event_timeout)
        try:
            send_message(sock, message)
        except OSError as exc:
            sock.close()
            raise EngineUnavailable(f"lost the engine connection: {exc}") from None
        return EventStream(sock, first_event_timeout, idle_timeout, client_gone)


class EventStream:
    """Events of one generation. `close()` (or leaving the `with`) cancels it at the engine.

    Lines are buffered here rather than in a file object, so waiting can be a select() that also
    watches the HTTP client (`client_gone`) without losing a partly received line."""

    def __init__(self, sock: socket.socket, first_event_timeout: float, idle_timeout: float,
                 client_gone: Callable[[], bool] | None = None):
        self._sock = sock
        self._buffer = bytearray()
        self._idle_timeout = idle_timeout
        self._first = True
        self._first_timeout = first_event_timeout
        self._client_gone = client_gone
        self._next_client_check = 0.0

    def _read_line(self, timeout: float) -> bytes | None:
        deadline = time.monotonic() + timeout
        while True:
            # Asked on a clock, not only when the engine is quiet: a busy generation sends events all the time.
            if self._client_gone is not None and time.monotonic() >= self._next_client_check:
                self._next_client_check = time.monotonic() + CLIENT_POLL_S
                if self._client_gone():
                    self.close()
                    raise ClientGone()
            end = self._buffer.find(b"\n")
            if end >= 0:
                line = bytes(self._buffer[:end])
                del self._buffer[:end + 1]
                return line
            left = deadline - time.monotonic()
            if left <= 0:
                raise EngineUnavailable(f"the engine sent nothing for {timeout:g}s")
            wait = min(left, CLIENT_POLL_S) if self._client_gone else left
            readable, _, _ = select.select([self._sock], [], [], wait)
            if not readable:
                continue
            chunk = self._sock.recv(1 << 16)
            if not chunk:
                return None
            self._buffer += chunk

    def next_event(self) -> dict:
        timeout = self._first_timeout if self._first else self._idle_timeout
        self._first = False
        try:
            line = self._read_line(timeout)
        except OSError as exc:
            raise EngineUnavailable(f"lost the engine connection: {exc}") from None
        if line is None:
            raise EngineUnavailable("the engine closed the connection before answering")
        return json.loads(line)

    def __iter__(self) -> Iterator[dict]:
        while True:
            event = self.next_event()
            yield event
            if event.get("type") in ("done", "error"):
                return

    def close(self) -> None:
        try:
            self._sock.close()
        except OSError:
            pass

    def __enter__(self) -> "EventStream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
