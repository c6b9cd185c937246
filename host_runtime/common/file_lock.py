"""One writer at a time for files that are read, changed and written back (the key file, the usage file), and one
owner at a time for a process's own folder (a serve's run folder)."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from host_runtime.common.errors import EveryCycleError


@contextlib.contextmanager
def updating(path: str | os.PathLike) -> Iterator[None]:
    """Hold the right to read, change and write back the file at `path`: an exclusive flock on its folder, which
    every writer of a file there takes, so two writers cannot both read the old file and each save only their own
    change (12 `keys create` at once kept 3 of the 12 keys without it). The folder, not a lock file beside it:
    nothing to create, to own, or to have replaced by a link. Not reentrant: take it once per change."""
    folder = Path(path).parent
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


class InUse(EveryCycleError):
    """Another process holds what this one would own (a serve's run folder)."""


def hold(path: str | os.PathLike, what: str) -> int:
    """Own `path` (a lock file, made if need be) for as long as this process lives: an exclusive flock taken
    without waiting, the holder's pid written in it. Returns the descriptor, which must stay open (closing it, or
    the process ending, lets go; forked children share it, exec'd ones do not inherit it). InUse naming the
    holder's pid where another process holds it: `what` says what is held, for the message."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise InUse(f"{what} is in use by another process (pid {holder})") from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd
