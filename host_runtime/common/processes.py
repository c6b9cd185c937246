"""Stopping a child process: ask, wait, then kill. One place for what the server, the benchmark,
the tests and the image's boot check all do."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import time
from collections.abc import Callable

PR_SET_PDEATHSIG = 1


def stop_process(proc: subprocess.Popen, timeout: float, *, group: bool = False,
                 ask: Callable[[], object] | None = None) -> float | None:
    """Ask `proc` to stop (SIGTERM to it, or to its whole process group; or `ask()`), give it
    `timeout` seconds, then SIGKILL. Always reaps it.

    Returns the seconds it took to stop when asked; None if it had to be killed or had already exited."""
    if proc.poll() is not None:
        return None

    def send(sig: int) -> None:
        try:
            os.killpg(proc.pid, sig) if group else proc.send_signal(sig)
        except ProcessLookupError:
            pass  # it exited between the poll and the signal

    t0 = time.monotonic()
    ask() if ask is not None else send(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
        return time.monotonic() - t0
    except subprocess.TimeoutExpired:
        send(signal.SIGKILL)
        proc.wait()
        return None


def die_with_parent() -> None:
    """A child's preexec_fn: SIGTERM when the thread that started it ends (PR_SET_PDEATHSIG), so a child never
    outlives a parent killed with SIGKILL (an engine would hold the model and its socket; a tunnel, its port)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
