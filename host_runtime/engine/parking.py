"""Where a parked sequence's KV waits (a request taken off its slot for a higher priority class): in RAM up to a
bound, then on disk beside the prefix cache's files, so that a flood of parked batch requests holds neither the
box's memory nor its slots. The state is llama.cpp's own bytes (llama_state_seq_get_data), given back whole.

Files are the engine's alone (0600, a name of its own, written whole before they count), removed when their
sequence resumes or is dropped, and those a stopped engine left behind are removed when the next starts.
"""

from __future__ import annotations

import logging
import os
import uuid
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)
PARK_RAM_BYTES = 256 << 20  # parked states held in RAM; past it they go to disk (where the engine has a directory)
SUFFIX = ".parked"


@dataclass
class ParkedState:
    nbytes: int
    data: bytes | None = None   # in RAM
    path: Path | None = None    # on disk

    @property
    def tier(self) -> str:
        return "ram" if self.data is not None else "disk"


class ParkingSpace:
    def __init__(self, directory: str | Path | None, ram_bytes: int = PARK_RAM_BYTES):
        self.directory = Path(directory) / "parked" if directory is not None else None
        self.ram_bytes = ram_bytes
        self._held: list[ParkedState] = []
        self._bytes = {"ram": 0, "disk": 0}  # by tier, kept as states come and go (read by /metrics)
        if self.directory is not None:
            for stale in self.directory.glob(f"*{SUFFIX}"):
                stale.unlink(missing_ok=True)

    def put(self, data: bytes) -> ParkedState:
        """The state kept: in RAM while the RAM bound holds it, else on disk (in RAM after all where the write
        fails: the disk full, say; the request goes on either way)."""
        state = None
        if self.directory is not None and self._bytes["ram"] + len(data) > self.ram_bytes:
            state = self._write(data)
        if state is None:
            state = ParkedState(len(data), data=data)
        self._held.append(state)
        self._bytes[state.tier] += state.nbytes
        return state

    def take(self, state: ParkedState) -> bytes:
        """The state's bytes, and it is gone from here. OSError where its file cannot be read."""
        self._forget(state)
        if state.data is not None:
            return state.data
        try:
            return state.path.read_bytes()
        finally:
            state.path.unlink(missing_ok=True)

    def drop(self, state: ParkedState) -> None:
        self._forget(state)
        if state.path is not None:
            state.path.unlink(missing_ok=True)

    def bytes_by_tier(self) -> dict[str, int]:
        return dict(self._bytes)

    def _forget(self, state: ParkedState) -> None:
        self._held.remove(state)
        self._bytes[state.tier] -= state.nbytes

    def _write(self, data: bytes) -> ParkedState | None:
        path = self.directory / f"{uuid.uuid4().hex}{SUFFIX}"
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "wb") as out:
                out.write(data)
        except OSError as exc:
            log.warning("a parked sequence's state stays in RAM: %s could not take it (%s)", self.directory, exc)
            path.unlink(missing_ok=True)
            return None
        return ParkedState(len(data), path=path)
