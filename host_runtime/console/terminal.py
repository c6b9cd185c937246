"""The console is a terminal program: it ends when its terminal does.

A console whose terminal went away (its tmux session killed, an SSH session dropped) was found spinning at 83% of
a core minutes later, reading end-of-file from a deleted pty: textual's input thread does not stop on it, and no
SIGHUP comes where the pty is not the process's controlling terminal (or the signal is ignored). So the console
ends on SIGHUP, and also when a poll of its terminal says it hung up, whichever comes first.
"""

from __future__ import annotations

import asyncio
import os
import select
import signal
import sys
import threading

WATCH_S = 1.0  # how often the terminal is polled
# After asking the app to exit: how long its shutdown may take before the process ends anyway (restoring a
# terminal that is gone can fail or block).
EXIT_GRACE_S = 5.0
HUNG_UP = select.POLLHUP | select.POLLERR | select.POLLNVAL


def terminal_gone(fd: int) -> bool:
    """Whether the terminal on `fd` has hung up or closed: poll reports POLLHUP, POLLERR or POLLNVAL (asked or
    not), or the descriptor is no longer a terminal."""
    try:
        if not os.isatty(fd):
            return True
        poller = select.poll()
        poller.register(fd, HUNG_UP)
        return any(events & HUNG_UP for _, events in poller.poll(0))
    except (OSError, ValueError):
        return True


class TerminalWatch:
    """Ends `app` (a textual App) when its terminal goes away; the process exits regardless after a grace period."""

    def __init__(self, app, fds: tuple[int, ...] | None = None):
        self.app = app
        self.fds = fds if fds is not None else tuple(f.fileno() for f in (sys.__stdin__, sys.__stdout__) if f)
        self.lost: str | None = None

    def start(self) -> None:
        """From the app's on_mount (the event loop's thread): SIGHUP and a poll every WATCH_S."""
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, self.hang_up, "SIGHUP")
        self.app.set_interval(WATCH_S, self.check)

    def check(self) -> None:
        if any(terminal_gone(fd) for fd in self.fds):
            self.hang_up("the terminal hung up")

    def hang_up(self, why: str) -> None:
        if self.lost is not None:
            return
        self.lost = why
        timer = threading.Timer(EXIT_GRACE_S, os._exit, args=(129,))  # 128 + SIGHUP, as a shell reports it
        timer.daemon = True
        timer.start()
        self.app.exit(return_code=129)
