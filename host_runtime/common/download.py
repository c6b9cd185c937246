"""Copying a stream to a file while hashing it, with progress (bytes, rate, time left): what the update's
fetch and the model store's pull both do. A download can resume where a partial file ends."""

from __future__ import annotations

import hashlib
import os
import stat
import time
from host_runtime.common.errors import InputError, UnavailableError


class Progress:
    """Bytes, rate and time left for one file, printed at most once a second (and once at the end)."""

    def __init__(self, name: str, total: int | None, say, interval_s: float = 1.0, already: int = 0, observe=None):
        """observe(progress), if given, is called whenever a line is said: a status file or a gauge follows."""
        self.name, self.total, self.say, self.interval = name, total, say, interval_s
        self.observe = observe
        self.done = already
        self._resumed_from = already  # the rate counts what this run moved
        self.start = self.last = time.monotonic()
        if observe is not None:
            observe(self)  # the size is known from the start

    def __call__(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        if now - self.last >= self.interval or (self.total is not None and self.done >= self.total):
            self.last = now
            self.say(self.line(now))
            if self.observe is not None:
                self.observe(self)

    def rate(self, now: float | None = None) -> float:
        elapsed = max((now or time.monotonic()) - self.start, 1e-6)
        return (self.done - self._resumed_from) / elapsed

    def line(self, now: float | None = None) -> str:
        rate = self.rate(now)
        text = f"{self.name}: {self.done / 2**20:,.0f} MiB"
        if self.total:
            left = (self.total - self.done) / rate if rate > 0 else 0
            text += f" of {self.total / 2**20:,.0f} MiB ({100 * self.done // self.total}%), {left:,.0f} s left"
        return text + f", {rate / 2**20:,.1f} MiB/s"


def file_sha256(path, digest=None, block: int = 4 << 20):
    """The sha256 object of a file's bytes (continuing `digest` if given)."""
    digest = digest or hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(block):
            digest.update(chunk)
    return digest


class TooLarge(InputError, ValueError):
    """The stream went on past the most bytes it may bring (its declared size, or the room it has)."""

    def __init__(self, limit: int):
        super().__init__(f"it went on past {limit:,} bytes, the most it may be")
        self.limit = limit


class Stalled(UnavailableError, OSError):
    """The server sent less than STALL_MIN_BYTES in STALL_WINDOW_S: a download that drips a byte now and then held
    a thread forever (each read came within the socket's timeout)."""


# Slower than about 1 KiB/s for a whole minute is not a download any more; what came is kept to resume from.
STALL_WINDOW_S = 60.0
STALL_MIN_BYTES = 64 << 10


def copy_hashing(stream, dest, progress, *, append: bool = False, digest=None, limit: int | None = None,
                 stall_window_s: float = STALL_WINDOW_S, stall_min_bytes: int = STALL_MIN_BYTES) -> str:
    """Write the stream to dest (after what is there, with append) and return the sha256 hex of the whole file;
    `digest` carries the hash of what dest already held. `limit`: the most bytes this copy may write (TooLarge past
    it, with no more written): a server that declares no size (or lies) cannot fill the disk before the hash is
    checked. Stalled where less than stall_min_bytes came in any stall_window_s."""
    digest = digest or hashlib.sha256()
    written = 0
    read = getattr(stream, "read_some", None) or stream.read
    window_start, window_bytes = time.monotonic(), 0
    # Never through a link: root pulls into a directory the services own, where one could be planted at dest.
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_APPEND if append else os.O_TRUNC)
    fd = os.open(dest, flags, 0o644)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise IsADirectoryError(f"{dest} is not a regular file")
    with stream, os.fdopen(fd, "wb") as out:
        while block := read(4 << 20):
            if limit is not None and written + len(block) > limit:
                raise TooLarge(limit)
            digest.update(block)
            out.write(block)
            written += len(block)
            progress(len(block))
            window_bytes += len(block)
            if window_bytes >= stall_min_bytes:
                window_start, window_bytes = time.monotonic(), 0
            elif time.monotonic() - window_start > stall_window_s:  # what came is kept, to resume from
                raise Stalled(f"under {stall_min_bytes >> 10} KiB came in {stall_window_s:.0f} s: the server "
                              "stalled")
    return digest.hexdigest()
