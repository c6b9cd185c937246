"""One writer at a time for files that are read, changed and written back (the key file, the usage file)."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path


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
