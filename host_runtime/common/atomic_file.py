"""Atomic file writes: a reader sees the old file or the new one, never half of either."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path


def _keep_owner(fd: int, target: Path, owner: tuple[int, int] | None) -> None:
    """A file root writes gets `owner` when given; else it keeps the replaced file's owner (the services' key file,
    edited by root's tools, stays theirs). Set on the open file before the rename, never through a path: in a
    directory the services own, a path could be swapped for a link to any file between the write and a chown."""
    if os.geteuid() != 0:
        return
    if owner is not None:
        os.fchown(fd, *owner)
        return
    try:
        st = target.lstat()  # a link in its place is replaced, not followed
    except FileNotFoundError:
        return
    if (st.st_uid, st.st_gid) != (0, 0) and not stat.S_ISLNK(st.st_mode):  # the one lstat's answer, not a second look
        os.fchown(fd, st.st_uid, st.st_gid)


def atomic_write(path: str | os.PathLike, data: bytes, mode: int = 0o644,
                 owner: tuple[int, int] | None = None) -> None:
    """Write `data` to `path` via a temp file in the same directory, fsync, rename.

    The temp file gets `mode` (and, written by root, `owner` or the replaced file's owner) before any byte is
    written, so a secret is never readable by others even for an instant.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        os.fchmod(fd, mode)
        _keep_owner(fd, target, owner)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, target)
    except BaseException:
        try:
            os.unlink(tmp_name)
        except FileNotFoundError:
            pass
        raise
    # The rename is durable only once the directory entry is on disk.
    dir_fd = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def replace_directory(prepared: Path, dest: Path) -> None:
    """Put a fully written directory in `dest`'s place: a reader finds the old one or the new one whole (the old
    one is moved aside, then removed)."""
    old = dest.with_name(dest.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if dest.exists():
        dest.rename(old)
    prepared.rename(dest)
    shutil.rmtree(old, ignore_errors=True)
