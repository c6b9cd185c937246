"""Framing between HTTP workers and the engine process (or the engine pool): one JSON object per line over a Unix
socket. What the lines mean is engine/wire.py's (and pool/protocol.py's); engine/client.py is the typed client.

One connection carries one call. For a generation the engine streams events on
it; the worker closing the connection is how a request is cancelled.
"""

from __future__ import annotations

import json
import select
import socket
import time
from collections.abc import Callable
from host_runtime.common.errors import UnavailableError

CLIENT_POLL_S = 0.1  # while waiting for the engine, how often to ask whether the HTTP client is still there
# The longest line each side reads (and the worker sends): a call carries a request body of at most 1 MiB by
# default (--max-body-bytes) made into messages, tools and a grammar of at most 256 KiB, beside its images' base64
# (32 MiB by default with the text, --max-media-body-bytes); the events' largest lines are 64 embeddings of a wide
# model. Past them a reader stops reading instead of growing without bound.
MAX_REQUEST_LINE_BYTES = 48 << 20
MAX_EVENT_LINE_BYTES = 64 << 20


class EngineUnavailable(UnavailableError):
    """The engine process is not listening, or did not answer in time."""


class MessageTooLarge(EngineUnavailable):
    """A line longer than its side allows: refused unsent (the worker's call) or unread (the engine's)."""

    def __init__(self, size: int, limit: int):
        super().__init__(f"the engine call is {size} bytes; at most {limit} are allowed")
        self.size, self.limit = size, limit


class ClientGone(Exception):
    """The HTTP client hung up while its request waited for the engine; the engine call was closed (cancelled)."""


def encode_line(message: dict, limit: int | None = None) -> bytes:
    line = json.dumps(message, separators=(",", ":")).encode()
    if limit is not None and len(line) > limit:
        raise MessageTooLarge(len(line), limit)
    return line + b"\n"


def send_message(sock: socket.socket, message: dict) -> None:
    sock.sendall(encode_line(message))


class LineReader:
    """One call's line, read by the side that answers it (the engine, the pool)."""

    def __init__(self, sock: socket.socket, limit: int = MAX_REQUEST_LINE_BYTES):
        self._file = sock.makefile("rb")
        self._limit = limit

    def read(self) -> dict | None:
        line = self._file.readline(self._limit + 1)
        if not line:
            return None
        if len(line) > self._limit:
            raise MessageTooLarge(len(line), self._limit)
        return json.loads(line)


class LineClient:
    """One call per connection, lines as dicts (engine/client.py types them). Calls never share state."""

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
            return reply.next_line()

    def stream(self, message: dict, first_event_timeout: float, idle_timeout: float,
               client_gone: Callable[[], bool] | None = None) -> "LineStream":
        line = encode_line(message, MAX_REQUEST_LINE_BYTES)  # refused before connecting: the engine never sees it
        sock = self._connect(first_event_timeout)
        try:
            sock.sendall(line)
        except OSError as exc:
            sock.close()
            raise EngineUnavailable(f"lost the engine connection: {exc}") from None
        return LineStream(sock, first_event_timeout, idle_timeout, client_gone)


class _Quiet(Exception):
    """_read_line's quiet_s passed without a line (the wait for it goes on at the next call)."""


class LineStream:
    """The lines answering one call (a generation's events). `close()` (or leaving the `with`) cancels it at the engine.

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
        self._waiting_since: float | None = None  # when the wait for the next line began (kept across QUIET)

    def _read_line(self, timeout: float, quiet_s: float | None = None) -> bytes | None:
        if self._waiting_since is None:
            self._waiting_since = time.monotonic()
        deadline = self._waiting_since + timeout
        quiet_at = time.monotonic() + quiet_s if quiet_s is not None else None
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
                self._waiting_since = None
                return line
            now = time.monotonic()
            left = deadline - now
            if left <= 0:
                raise EngineUnavailable(f"the engine sent nothing for {timeout:g}s")
            if quiet_at is not None and now >= quiet_at:
                raise _Quiet()
            wait = min(left, CLIENT_POLL_S) if self._client_gone else left
            if quiet_at is not None:
                wait = min(wait, quiet_at - now)
            readable, _, _ = select.select([self._sock], [], [], wait)
            if not readable:
                continue
            chunk = self._sock.recv(1 << 16)
            if not chunk:
                return None
            self._buffer += chunk
            if len(self._buffer) > MAX_EVENT_LINE_BYTES and self._buffer.find(b"\n") < 0:
                self.close()
                raise EngineUnavailable(f"the engine sent a line of over {MAX_EVENT_LINE_BYTES} bytes")

    def next_line(self) -> dict:
        line = self.next_line_or_quiet(None)
        assert line is not None  # no quiet_s, no quiet answer
        return line

    def next_line_or_quiet(self, quiet_s: float | None) -> dict | None:
        """The next line's object, or None when none came for quiet_s (the time waited still counts towards the
        idle timeout: asked again, the wait goes on)."""
        timeout = self._first_timeout if self._first else self._idle_timeout
        try:
            line = self._read_line(timeout, quiet_s)
        except _Quiet:
            return None
        except OSError as exc:
            raise EngineUnavailable(f"lost the engine connection: {exc}") from None
        if line is None:
            raise EngineUnavailable("the engine closed the connection before answering")
        self._first = False
        return json.loads(line)

    def close(self) -> None:
        try:
            self._sock.close()
        except OSError:
            pass

    def __enter__(self) -> "LineStream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
