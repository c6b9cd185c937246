"""The engine side of the Unix socket, for any engine process (a llama.cpp model's, engine/service.py; a Whisper
model's, speech/service.py): one request line per connection read and typed (engine/wire.py), a malformed or
oversized one refused in the wire's error shape, the rest handed to the process's handler. Nothing here loads a
model, so a process that runs another library (whisper.cpp's ggml) never loads llama.cpp's beside it."""

from __future__ import annotations

import logging
import os
import signal
import socket
import socketserver
import threading
from pathlib import Path

from host_runtime.common.stop_signal import stop_on_signals
from host_runtime.engine import wire
from host_runtime.engine.errors import RequestRejected
from host_runtime.engine.ipc import LineReader, MessageTooLarge, send_message

log = logging.getLogger("host_runtime.engine.service")


class RequestHandler(socketserver.BaseRequestHandler):
    """Reads and types the connection's request; `answer(sock, request)` is the process's own."""

    def answer(self, sock: socket.socket, request) -> None:
        raise NotImplementedError

    def handle(self) -> None:
        sock: socket.socket = self.request
        try:
            line = LineReader(sock).read()
            if not line:
                return
            request = wire.request_from_wire(line)
        except MessageTooLarge as exc:
            refuse(sock, RequestRejected(413, str(exc), code="request_too_large"))
            return
        except wire.WireError as exc:
            refuse(sock, RequestRejected(400, f"a malformed engine call: {exc}", code="bad_engine_call"))
            return
        except (OSError, ValueError):
            return
        try:
            self.answer(sock, request)
        except (BrokenPipeError, ConnectionResetError):
            pass


def refuse(sock: socket.socket, rejected: RequestRejected) -> None:
    try:
        send_message(sock, wire.event_to_wire(wire.Error(rejected)))
    except OSError:
        pass


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    request_queue_size = 128


def serve_socket(socket_path: str, service, handler: type[RequestHandler]) -> None:
    """Listen first (so workers can tell "loading" from "down"), then `service.load()`, then serve until killed;
    SIGTERM runs `service.save_usage()` first."""
    path = Path(socket_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        path.unlink()
    server = _Server(str(path), type("Handler", (handler,), {"service": service}))
    os.chmod(path, 0o600)
    thread = threading.Thread(target=server.serve_forever, name="engine-ipc", daemon=True)
    thread.start()

    def stopping() -> None:
        # SIGTERM (the pool stopping it): keep what the keys used since the last save, then end at once, as the
        # signal's default did (status 143: 128 + SIGTERM). From this helper thread: signal.signal() would refuse.
        try:
            service.save_usage()
        finally:
            os._exit(128 + signal.SIGTERM)

    if threading.current_thread() is threading.main_thread():  # (tests run engines on other threads)
        stop_on_signals(stopping)
    log.info("engine listening on %s", path)
    service.load()
    try:
        # Woken often: a signal may reach another thread, and only this one runs its handler, between bytecodes.
        while thread.is_alive():
            thread.join(0.2)
    finally:
        server.server_close()
