"""Pulls running at once, the disk they have reserved, and the partial files they leave (#56, item 5).

Without bounds, pulls through the API each held a serving thread for as long as their server dripped bytes,
each passed the free-space check alone (two 30 GiB pulls on 40 GiB free both started), and a cut-off pull's part
stayed on disk, listed nowhere. Now, in the store's partial folder, shared by every process that pulls (the
serving workers, the first-boot pull, root's CLI):
- a pull holds an flock on NAME.lock while it runs: at most MAX_PULLS at once, one per name;
- a pull reserves what it has still to write (NAME.json's total less NAME.gguf.part's size), and the room check
  counts the other running pulls' reservations;
- a part no pull holds, untouched for PARTIAL_TTL_S, is removed when the next pull starts; `everycycle models
  list` shows the parts there are.
Starting and reserving take the folder's own flock (common/file_lock.py), so two starts see each other.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from host_runtime.common.atomic_file import atomic_write
from host_runtime.common.file_lock import updating
from host_runtime.models.errors import StoreError

MAX_PULLS = 2  # a third would only share the same link, and each through the API holds a serving thread
PARTIAL_TTL_S = 2 * 86400.0  # long enough to resume tomorrow; then it is the disk's again


class PullsBusy(StoreError):
    """As many pulls as the box runs at once are running, or this name's is (same_name): try again when one has
    ended."""

    def __init__(self, message: str, same_name: bool = False):
        super().__init__(message)
        self.same_name = same_name


@dataclass(frozen=True)
class Partial:
    """A pull's part in the store: what came, of what total (None: undeclared), when last written, and whether a
    pull holds it now."""

    name: str
    done_bytes: int
    total_bytes: int | None
    age_s: float
    running: bool


def _paths(folder: Path, name: str) -> tuple[Path, Path, Path]:
    return folder / f"{name}.gguf.part", folder / f"{name}.json", folder / f"{name}.lock"


def _held(lock: Path) -> bool:
    """Whether a pull holds `lock` now (taken and given back at once where none does)."""
    try:
        fd = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def _names(folder: Path) -> set[str]:
    names = set()
    for p in folder.iterdir():
        for suffix in (".gguf.part", ".json", ".lock"):
            if p.name.endswith(suffix) and not p.name.startswith("."):
                names.add(p.name[: -len(suffix)])
        if p.is_dir() and p.name.startswith("hf-"):
            names.add(p.name[3:])
    return names


def partials(folder: Path) -> list[Partial]:
    """Every pull's part in `folder`, running or left behind."""
    out = []
    now = time.time()
    for name in sorted(_names(folder)):
        part, meta, lock = _paths(folder, name)
        hf = folder / f"hf-{name}"
        try:
            st = part.stat()
            done, mtime = st.st_size, st.st_mtime
        except FileNotFoundError:
            if not hf.is_dir() and not meta.exists() and not _held(lock):
                continue  # a lock alone, and no pull holds it: nothing there
            done = sum(f.stat().st_size for f in hf.rglob("*") if f.is_file()) if hf.is_dir() else 0
            mtime = max((p.stat().st_mtime for p in (meta, hf) if p.exists()), default=now)
        try:
            total = json.loads(meta.read_text()).get("total")
        except (OSError, ValueError, AttributeError):
            total = None
        out.append(Partial(name, done, total if isinstance(total, int) else None, max(0.0, now - mtime),
                           _held(lock)))
    return out


def _remove(folder: Path, name: str) -> None:
    for p in _paths(folder, name):
        p.unlink(missing_ok=True)
    shutil.rmtree(folder / f"hf-{name}", ignore_errors=True)


class PullSlot:
    """The right to pull `name` into the store: taken by take(), given back by release() (or the process's end).
    reserve(total) checks the room the other running pulls leave and records this pull's own."""

    def __init__(self, folder: Path, name: str, fd: int):
        self.folder, self.name, self._fd = folder, name, fd

    @classmethod
    def take(cls, folder: Path, name: str, max_pulls: int = MAX_PULLS,
             ttl_s: float = PARTIAL_TTL_S) -> PullSlot:
        """PullsBusy where `name` is being pulled or max_pulls are running; expired parts are removed first."""
        part, meta, lock = _paths(folder, name)
        with updating(folder / ".slots"):
            found = partials(folder)
            for p in found:
                if not p.running and p.age_s > ttl_s and p.name != name:
                    _remove(folder, p.name)
            for orphan in folder.glob("*.lock"):  # a released slot's, with nothing beside it
                if orphan.name[:-5] not in {p.name for p in found}:
                    orphan.unlink(missing_ok=True)
            running = [p.name for p in found if p.running]
            if name in running:
                raise PullsBusy(f"'{name}' is being pulled already; wait for that pull to end", same_name=True)
            if len(running) >= max_pulls:
                raise PullsBusy(f"{len(running)} pulls are running ({', '.join(running)}), as many as the box runs "
                                "at once; try again when one has ended")
            fd = os.open(lock, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # taken between the look and here by a process that skipped the folder's lock
                os.close(fd)
                raise PullsBusy(f"'{name}' is being pulled already; wait for that pull to end", same_name=True) from None
        return cls(folder, name, fd)

    def others_reserved(self) -> int:
        """The bytes the other running pulls have still to write (their declared totals less their parts)."""
        return sum(max(0, p.total_bytes - p.done_bytes) for p in partials(self.folder)
                   if p.running and p.name != self.name and p.total_bytes is not None)

    def reserve(self, source: str, total: int | None, room: int, already: int = 0) -> int:
        """Record this pull's source and total (NAME.json), after checking that what it still needs fits in
        `room` (the store's free space less its reserve) beside the other running pulls' reservations. Returns
        the bytes this pull may write (the room left, where the total is not declared). StoreError where it does
        not fit; nothing is written then."""
        _, meta, _ = _paths(self.folder, self.name)
        with updating(self.folder / ".slots"):
            left = room - self.others_reserved()
            need = None if total is None else total - already
            if need is not None and need > left:
                raise StoreError(f"{self.name} needs {need / 2**30:.2f} GiB more; the store has room for "
                                 f"{max(left, 0) / 2**30:.2f} GiB beside the pulls running now: free some space "
                                 "(everycycle models rm), or wait for them to end")
            atomic_write(meta, json.dumps({"source": source, "total": total}).encode(), mode=0o600)
        return max(0, left) if need is None else need

    def finish(self) -> None:
        """The pull has ended for good (admitted, or refused): its part, record and lock go, then the slot."""
        with updating(self.folder / ".slots"):
            for p in _paths(self.folder, self.name)[:2]:
                p.unlink(missing_ok=True)
            shutil.rmtree(self.folder / f"hf-{self.name}", ignore_errors=True)
        self.release()

    def release(self) -> None:
        """Given back; its lock file goes too where nothing of this pull is left beside it."""
        if self._fd < 0:
            return
        part, meta, lock = _paths(self.folder, self.name)
        with updating(self.folder / ".slots"):
            if not part.exists() and not meta.exists() and not (self.folder / f"hf-{self.name}").exists():
                lock.unlink(missing_ok=True)
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> PullSlot:
        return self

    def __exit__(self, *exc) -> None:
        self.release()
