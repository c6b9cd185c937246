"""One key ledger for the whole box (#56, item 11): every engine process and the API's workers count into the same
file, so a key's tokens-per-minute and per-day limits hold across models, and across an engine idling out or
restarting, and the embeddings, rerank and tokenize endpoints count too.

Counting never waits on the disk: `add` puts the use in this process's pending ledger at once (its own next
`refusal` sees it) and a writer thread folds pending uses into the file under an exclusive flock, written
atomically. `refusal` reads the file (again only when it changed) plus what is pending. A file that cannot be
written (a full disk, a folder it cannot make) leaves the uses in memory, said once; an unreadable file is said
and counted from empty (a limit, not a bill: the per-key usage counters are engine/usage_file.py's).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import threading
import time
from pathlib import Path

from host_runtime.common.atomic_file import atomic_write
from host_runtime.engine.key_ledger import KeyLedger, Refusal

log = logging.getLogger("everycycle.engine")
LEDGER_NAME = "key_windows.ledger"  # in the usage folder; not *.json, which `keys usage` reads as a model's usage


class SharedKeyLedger:
    """KeyLedger's add and refusal, thread-safe, kept in `path` (None: in this process's memory only)."""

    def __init__(self, path: str | os.PathLike | None):
        self.path = Path(path) if path else None
        self._lock = threading.Lock()
        self._pending = KeyLedger()        # uses not yet in the file
        self._writing = KeyLedger()        # uses being written: still counted until the file has them
        self._read = KeyLedger()           # the file as last read
        self._read_stamp: tuple | None = None
        self._writer_lock = threading.Lock()
        self._wake = threading.Event()
        self._warned = False
        self._writer: threading.Thread | None = None

    def add(self, key: str, tokens: int, now: float) -> None:
        with self._lock:
            self._pending.add(key, tokens, now)
            if self.path is not None and self._writer is None:
                self._writer = threading.Thread(target=self._write_loop, name="key-ledger", daemon=True)
                self._writer.start()
        self._wake.set()

    def refusal(self, key: str, per_minute: int, per_day: int, now: float,
                elsewhere: tuple[int, int] = (0, 0)) -> Refusal | None:
        with self._lock:
            seen = self._read_locked().only(key)
            seen.merge(self._writing.only(key), now)
            seen.merge(self._pending.only(key), now)
        return seen.refusal(key, per_minute, per_day, now, elsewhere)

    def use_by_key(self, suffix: str, now: float) -> dict[str, list[int]]:
        with self._lock:
            seen = KeyLedger()
            seen.merge(self._read_locked(), now)
            seen.merge(self._writing, now)
            seen.merge(self._pending, now)
        return seen.use_by_key(suffix, now)

    def flush(self) -> None:
        """What is pending into the file now (the process is stopping)."""
        if self.path is not None:
            self._write_pending()

    # ---- the file ------------------------------------------------------------------------------------------

    def _read_locked(self) -> KeyLedger:
        """The file's ledger, read again only when its inode, size or time changed (under self._lock)."""
        if self.path is None or self._writing:
            # while this process writes, the file may already hold what _writing still counts: read it after
            return self._read
        try:
            st = self.path.stat()
        except OSError:
            return self._read
        stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
        if stamp != self._read_stamp:
            self._read = _load(self.path)
            self._read_stamp = stamp
        return self._read

    def _write_loop(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            self._write_pending()

    def _write_pending(self) -> None:
        path = self.path
        if path is None:
            return
        with self._writer_lock:  # the writer thread and flush() one at a time
            with self._lock:
                pending, self._pending = self._pending, KeyLedger()
                self._writing = pending
            if not pending:
                return
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                with open(path.with_name(path.name + ".lock"), "a") as lock:
                    fcntl.flock(lock, fcntl.LOCK_EX)  # one writer at a time among the box's processes
                    ledger = _load(path)
                    ledger.merge(pending, time.time())
                    atomic_write(path, json.dumps(ledger.to_doc(), separators=(",", ":")).encode(), 0o600)
                    st = path.stat()
                    with self._lock:  # the file as written, in one step with the uses leaving _writing
                        self._read, self._read_stamp = ledger, (st.st_ino, st.st_size, st.st_mtime_ns)
                        self._writing = KeyLedger()
            except OSError as exc:
                with self._lock:
                    pending.merge(self._pending, time.time())
                    self._pending, self._writing = pending, KeyLedger()  # kept, and tried again at the next use
                if not self._warned:
                    self._warned = True
                    log.warning("the key ledger %s cannot be written (%s): key token limits count in this "
                                "process only", path, exc)


def _load(path: Path) -> KeyLedger:
    try:
        return KeyLedger.from_doc(json.loads(path.read_bytes()))
    except FileNotFoundError:
        return KeyLedger()
    except (OSError, ValueError, TypeError) as exc:
        log.warning("the key ledger %s cannot be read (%s): key token limits count from now", path, exc)
        return KeyLedger()
