"""Framing between HTTP workers and the engine process: one JSON object per line over a Unix socket.

One connection carries one call. For a generation the engine streams events on
it; the worker closing the connection is how a request is cancelled.
"""

from __future__ import annotations

import json
import socket
from typing import Iterator


class EngineUnavailable(Exception):
    """The engine process is not listening, or did not answer in time."""


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

    def call(self, message: dict, timeout: float | None = None) -> dict:
        timeout = self.timeout if timeout is None else timeout
        sock = self._connect(timeout)
        try:
            send_message(sock, message)
            reply = LineReader(sock).read()
        except (socket.timeout, TimeoutError):
            raise EngineUnavailable(f"the engine did not answer within {timeout:g}s") from None
        except OSError as exc:
            raise EngineUnavailable(f"lost the engine connection: {exc}") from None
        finally:
            sock.close()
        if reply is None:
            raise EngineUnavailable("the engine closed the connection without answering")
        return reply

    def stream(self, message: dict, first_event_timeout: float, idle_timeout: float) -> "EventStream":
        sock = self._connect(first_event_timeout)
        try:
            send_message(sock, message)
        except OSError as exc:
            sock.close()
            raise EngineUnavailable(f"lost the engine connection: {exc}") from None
        return EventStream(sock, first_event_timeout, idle_timeout)


class EventStream:
    """Events of one generation. `close()` (or leaving the `with`) cancels it at the engine."""

    def __init__(self, sock: socket.socket, first_event_timeout: float, idle_timeout: float):
        self._sock = sock
        self._reader = LineReader(sock)
        self._idle_timeout = idle_timeout
        self._first = True
        self._first_timeout = first_event_timeout

    def next_event(self) -> dict:
        self._sock.settimeout(self._first_timeout if self._first else self._idle_timeout)
        self._first = False
        try:
            event = self._reader.read()
        except (socket.timeout, TimeoutError):
            raise EngineUnavailable("the engine stopped sending tokens") from None
        except OSError as exc:
            raise EngineUnavailable(f"lost the engine connection: {exc}") from None
        if event is None:
            raise EngineUnavailable("the engine closed the connection mid-generation")
        return event

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
