"""Per-key usage kept across restarts: the engine's counters (metrics.EngineMetrics.KEY_USAGE, by key name) for
one model, on the data partition, read back at start and summed over models by `everycycle keys usage`.

Each settled request is appended to a log at once (written, not synced: a killed process loses nothing the kernel
holds; saving every 2 s, 4 hard kills lost 33 of 143 requests). Every SAVE_EVERY_S the counters are folded into
a snapshot, written atomically. Logs are numbered: the snapshot says the last log it covers; a fold starts the next
log under the counters' lock, writes the snapshot, then deletes what it covers, so a crash at any point neither
loses nor counts twice. A full disk leaves the counters in memory and the files as they were (the next fold writes
everything). An unreadable snapshot or log stops the engine with the reason (UsageFileError): never a count
from zero that the next save would make permanent.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

from host_runtime.common.errors import EveryCycleError
from host_runtime.common.atomic_file import atomic_write

log = logging.getLogger("everycycle.engine")
SAVE_EVERY_S = 2.0  # how often the logs are folded into the snapshot


class UsageFileError(EveryCycleError):
    """The usage file or its log cannot be read; the message names it and what to do."""


def _log_path(path: Path, generation: int) -> Path:
    return path.with_name(f"{path.name}.log.{generation}")


def _logs(path: Path) -> list[tuple[int, Path]]:
    out = []
    for p in path.parent.glob(f"{path.name}.log.*"):
        suffix = p.name.rsplit(".", 1)[-1]
        if suffix.isdigit():
            out.append((int(suffix), p))
    return sorted(out)


def _add(into: dict[str, dict[str, float]], key: str, counters: dict) -> None:
    mine = into.setdefault(str(key), {})
    for name, value in counters.items():
        mine[str(name)] = mine.get(str(name), 0.0) + float(value)


def load_state(path: str | Path) -> tuple[dict[str, dict[str, float]], int]:
    """(the counters, the last log generation they include): the snapshot and every newer log. UsageFileError
    where one is unreadable; a log's last line cut short (a write that failed halfway) is left out."""
    path = Path(path)
    usage: dict[str, dict[str, float]] = {}
    generation = 0
    try:
        doc = json.loads(path.read_text())
        generation = int(doc.get("generation", 0))
        for key, counters in doc["keys"].items():
            _add(usage, key, counters)
    except (FileNotFoundError, NotADirectoryError):  # none kept yet (or nowhere it could be: UsageBook says so)
        pass
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UsageFileError(f"the usage file {path} is unreadable ({exc}): move it away to count from zero, "
                             "or put back a good copy; the engine does not start rather than lose it") from None
    for g, log_file in _logs(path):
        if g <= generation:
            continue  # folded into the snapshot already
        try:
            lines = log_file.read_text().split("\n")
        except OSError as exc:
            raise UsageFileError(f"the usage log {log_file} is unreadable ({exc.strerror})") from None
        for i, line in enumerate(lines):
            if not line:
                continue
            try:
                key, counters = json.loads(line)
                _add(usage, key, counters)
            except (ValueError, TypeError, AttributeError):
                if i == len(lines) - 1:  # the last line, cut short by a failed write: that request is lost
                    continue
                raise UsageFileError(f"the usage log {log_file} is damaged at line {i + 1}: move it away to "
                                     "count without it") from None
        generation = max(generation, g)  # its lines are in: the next log is after it
    return usage, generation


def load(path: str | Path) -> dict[str, dict[str, float]]:
    """The counters kept at `path` (snapshot and logs); none where there is none. UsageFileError if unreadable."""
    return load_state(path)[0]


def save(path: str | Path, usage: dict[str, dict[str, float]], generation: int = 0) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    atomic_write(Path(path), json.dumps({"version": 2, "generation": generation, "keys": usage},
                                        sort_keys=True).encode(), mode=0o600)


def read_all(directory: str | Path) -> dict[str, dict[str, float]]:
    """Every model's usage in `directory`, summed per key (an unreadable one is left out, said in the log)."""
    total: dict[str, dict[str, float]] = {}
    d = Path(directory)
    # each model's snapshot, or its logs alone where it was killed before its first fold
    models = {p.name for p in d.glob("*.json")} | {p.name.split(".log.")[0] for p in d.glob("*.json.log.*")}
    for path in sorted(d / name for name in models):
        try:
            usage = load(path)
        except UsageFileError as exc:
            log.warning("%s", exc)
            continue
        for key, counters in usage.items():
            _add(total, key, counters)
    return total


class UsageBook:
    """One model's usage file and its logs, written by this engine alone. `record` is called with each settled
    request's counts inside the counters' lock (EngineMetrics.on_key_used); a thread folds every SAVE_EVERY_S."""

    def __init__(self, path: str | Path, locked_snapshot: Callable[[Callable[[dict], None]], dict]):
        """locked_snapshot(fn): the counters' copy, with fn(copy) run inside their lock (the fold's rotation)."""
        self.path = Path(path)
        self._locked_snapshot = locked_snapshot
        self._usage, self._generation = load_state(self.path)  # UsageFileError: the engine does not start
        self._log = None
        self._failed = False
        self._changed = False
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # a directory it may not make (the image's first release lacked it): serve anyway,
            self._warn(exc)     # counting in memory, said once; the folds keep trying
        self._open_next_log()

    @property
    def loaded(self) -> dict[str, dict[str, float]]:
        """What the files held at start: the counters to begin from."""
        return self._usage

    def _open_next_log(self) -> None:
        self._generation += 1
        old, self._log = self._log, None
        if old is not None:
            old.close()
        try:
            fd = os.open(_log_path(self.path, self._generation), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            self._log = os.fdopen(fd, "a")
        except OSError as exc:
            self._warn(exc)

    def record(self, key: str, counts: dict[str, float]) -> None:
        """Inside the counters' lock: this request's counts, appended to the log now."""
        self._changed = True
        if self._log is None:
            return
        try:
            self._log.write(json.dumps([key, counts]) + "\n")
            self._log.flush()
        except OSError as exc:  # a full disk: in memory until a fold can write
            self._warn(exc)

    def fold(self) -> None:
        """The counters into the snapshot, the logs it covers removed (the saver's thread; the engine's stop)."""
        if not self._changed:
            return
        covered = self._generation
        usage = self._locked_snapshot(lambda _: self._open_next_log())  # later records go to the next log
        self._changed = False
        try:
            save(self.path, usage, covered)
        except OSError as exc:
            self._changed = True  # the logs stay; the next fold writes everything
            self._warn(exc)
            return
        self._failed = False
        for g, old in _logs(self.path):
            if g <= covered:
                old.unlink(missing_ok=True)

    def start(self) -> None:
        def run() -> None:
            stop = threading.Event()
            while not stop.wait(SAVE_EVERY_S):
                self.fold()

        threading.Thread(target=run, name="usage-saver", daemon=True).start()

    def _warn(self, exc: OSError) -> None:
        if not self._failed:  # once, not at every request
            log.warning("cannot write per-key usage to %s (%s): it is kept in memory until it can", self.path, exc)
        self._failed = True
