"""Stopping a service on SIGTERM without taking a lock inside the signal handler.

A Python signal handler runs in the main thread between two bytecodes, possibly while that thread holds
the very lock the handler wants: `threading.Event.set()` from a handler deadlocks when the main loop is
inside `Event.wait()`'s own `with self._cond:` (the governor hung on supervisord's stop in CI this way).
So the handler only writes a byte to a pipe; a helper thread reads it and calls `stop()` as any thread may.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable


def stop_on_signals(stop: Callable[[], None], signals=(signal.SIGTERM,)) -> None:
    """Call stop() from a helper thread when one of signals arrives. Call from the main thread."""
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)

    def handler(signum, frame):
        try:
            os.write(write_fd, b"\0")  # no Python lock on this path
        except BlockingIOError:
            pass  # the pipe already holds a wake-up

    def waiter():
        os.read(read_fd, 1)
        stop()

    threading.Thread(target=waiter, name="stop-on-signal", daemon=True).start()
    for signum in signals:
        signal.signal(signum, handler)
