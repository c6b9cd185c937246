"""Where cached prefixes' KV bytes live: a dict in RAM, and checksummed files in a directory.

Disk writes and deletes run on a background thread so the decode loop never waits for
fsync; a read of a key still being written is served from the pending bytes. A file
that is truncated, altered, from another model or otherwise unreadable is reported,
deleted and treated as a miss: it is never loaded into the context.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import queue
import shutil
import struct
import threading
from pathlib import Path

from host_runtime.common.atomic_file import atomic_write

log = logging.getLogger(__name__)

MAGIC = b"EVERYCYCLE-KV\x01\n"
Key = tuple[int, ...]


def tokens_digest(fingerprint: str, key: Key) -> str:
    h = hashlib.sha256(fingerprint.encode())
    h.update(struct.pack(f"<{len(key)}i", *key))
    return h.hexdigest()


def encode_file(fingerprint: str, key: Key, payload: bytes) -> bytes:
    header = json.dumps({"fingerprint": fingerprint, "tokens": list(key), "payload_len": len(payload),
                         "payload_sha256": hashlib.sha256(payload).hexdigest()}).encode()
    return MAGIC + struct.pack("<I", len(header)) + header + payload


class CorruptEntry(Exception):
    pass


def decode_header(raw: bytes, fingerprint: str) -> tuple[dict, int]:
    if not raw.startswith(MAGIC):
        raise CorruptEntry("bad magic")
    if len(raw) < len(MAGIC) + 4:
        raise CorruptEntry("truncated header")
    (n,) = struct.unpack_from("<I", raw, len(MAGIC))
    start = len(MAGIC) + 4
    try:
        header = json.loads(raw[start:start + n])
    except ValueError:
        raise CorruptEntry("unreadable header") from None
    if not isinstance(header, dict) or header.get("fingerprint") != fingerprint:
        raise CorruptEntry("written for another model or engine build")
    return header, start + n


def decode_file(raw: bytes, fingerprint: str, key: Key) -> bytes:
    header, offset = decode_header(raw, fingerprint)
    if tuple(header.get("tokens", ())) != key:
        raise CorruptEntry("holds other tokens")
    payload = raw[offset:]
    if len(payload) != header.get("payload_len"):
        raise CorruptEntry(f"payload is {len(payload)} bytes, header says {header.get('payload_len')}")
    if hashlib.sha256(payload).hexdigest() != header.get("payload_sha256"):
        raise CorruptEntry("payload checksum mismatch")
    return payload


def free_space_reserve(total_bytes: int) -> int:
    """What the disk tier leaves free on its file system: 10 % of it, at least 1 GiB, at most 20 GiB (the
    journal, updates and the model store share that disk)."""
    return min(max(total_bytes // 10, 1 << 30), 20 << 30)


def disk_budget(configured: int, free_bytes: int, total_bytes: int, already_cached: int = 0) -> int:
    """The disk tier's budget: the configured one, bounded by what the file system can give without dropping
    below its reserve (entries already there count as available, since they are the tier's own)."""
    return max(0, min(configured, free_bytes + already_cached - free_space_reserve(total_bytes)))


class KVStore:
    def __init__(self, directory: str | Path | None, fingerprint: str):
        self.directory = Path(directory) if directory else None
        self.fingerprint = fingerprint
        self.ram: dict[Key, bytes] = {}
        self.corrupt_files = 0
        self.writes_skipped_for_space = 0
        self._pending: dict[Key, bytes] = {}
        # Demoted entries whose file was never written (no room, a failed write): the policy still counts them on
        # disk until the engine takes them (take_unwritten); their bytes are not kept.
        self._unwritten: list[Key] = []
        self._lock = threading.Lock()
        self._jobs: queue.Queue = queue.Queue()
        if self.directory is not None:
            # 0700: the entries are users' prompts, in the model's representation.
            self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            os.chmod(self.directory, 0o700)
            threading.Thread(target=self._writer, name="kv-writer", daemon=True).start()

    def space(self) -> tuple[int, int]:
        """(free, total) bytes of the disk tier's file system."""
        usage = shutil.disk_usage(self.directory)
        return usage.free, usage.total

    def path_for(self, key: Key) -> Path:
        return self.directory / (tokens_digest(self.fingerprint, key)[:40] + ".kv")

    # ---- RAM ----------------------------------------------------------------------

    def put_ram(self, key: Key, data: bytes) -> None:
        self.ram[key] = data

    def drop_ram(self, key: Key) -> None:
        self.ram.pop(key, None)

    # ---- disk -----------------------------------------------------------------------

    def demote(self, key: Key) -> None:
        data = self.ram.pop(key, None)
        if data is None or self.directory is None:
            return
        with self._lock:
            self._pending[key] = data
        self._jobs.put(("write", key))

    def drop_disk(self, key: Key) -> None:
        if self.directory is not None:
            self._jobs.put(("delete", key))

    def read_disk(self, key: Key) -> bytes | None:
        with self._lock:
            pending = self._pending.get(key)
        if pending is not None:
            return pending
        path = self.path_for(key)
        try:
            return decode_file(path.read_bytes(), self.fingerprint, key)
        except FileNotFoundError:
            return None  # never written (the disk was short of space): a plain miss
        except (OSError, CorruptEntry) as exc:
            self.corrupt_files += 1
            log.warning("prefix cache file %s ignored: %s", path.name, exc)
            path.unlink(missing_ok=True)
            return None

    def scan(self) -> list[tuple[Key, int]]:
        """Entries an earlier run left on disk (header checked now, payload checked when loaded)."""
        found = []
        if self.directory is None:
            return found
        for path in sorted(self.directory.glob("*.kv"), key=lambda p: p.stat().st_mtime):
            try:
                with path.open("rb") as handle:
                    head = handle.read(1 << 20)
                header, _ = decode_header(head, self.fingerprint)
                key = tuple(int(t) for t in header["tokens"])
                if path != self.path_for(key):
                    raise CorruptEntry("file name does not match its tokens")
                found.append((key, int(header["payload_len"])))
            except (OSError, CorruptEntry, KeyError, TypeError, ValueError) as exc:
                log.warning("prefix cache file %s ignored: %s", path.name, exc)
                path.unlink(missing_ok=True)
        return found

    def take_unwritten(self) -> list[Key]:
        """The entries the disk tier lost since the last call: the policy forgets them (a failed write left 9
        entries and 77 MB counted on disk against 4 files and 34 MB, and their bytes held in RAM)."""
        with self._lock:
            lost, self._unwritten = self._unwritten, []
        return lost

    def flush(self, timeout: float = 30.0) -> None:
        """Wait for queued disk work (tests, shutdown)."""
        done = threading.Event()
        self._jobs.put(("mark", done))
        done.wait(timeout)

    def _write(self, key: Key) -> None:
        with self._lock:
            data = self._pending.get(key)
        if data is None:
            return  # dropped meanwhile
        written = False
        try:
            free, total = self.space()
            if free - len(data) < free_space_reserve(total):
                # The disk filled up for other reasons since the budget was set: keep its reserve.
                self.writes_skipped_for_space += 1
                if self.writes_skipped_for_space == 1:
                    log.warning("prefix cache: %s has %.1f GiB free, under its reserve; entries are no longer "
                                "written to disk", self.directory, free / 2**30)
            else:
                atomic_write(self.path_for(key), encode_file(self.fingerprint, key, data), mode=0o600)
                written = True
        except OSError as exc:
            log.error("prefix cache: could not write an entry to %s: %s", self.directory, exc)
        finally:
            with self._lock:
                if self._pending.pop(key, None) is not None and not written:
                    self._unwritten.append(key)

    def _writer(self) -> None:
        while True:
            job, arg = self._jobs.get()
            try:
                if job == "write":
                    self._write(arg)
                elif job == "delete":
                    with self._lock:
                        self._pending.pop(arg, None)
                    self.path_for(arg).unlink(missing_ok=True)
                elif job == "mark":
                    arg.set()
            except OSError as exc:
                log.error("prefix cache disk work failed: %s", exc)
