"""Per-key usage kept across restarts: the engine's counters (metrics.EngineMetrics.KEY_USAGE, by key name) in a
JSON file per model on the data partition, written atomically every few seconds while they change; read back at
start, and summed over models by `everycycle keys usage`."""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

from host_runtime.common.atomic_file import atomic_write

log = logging.getLogger("everycycle.engine")
SAVE_EVERY_S = 2.0  # at most this much usage is lost when the engine is killed


def load(path: str | Path) -> dict[str, dict[str, float]]:
    """The counters saved at `path`; none where there is no file, or an unreadable one (said in the log)."""
    try:
        doc = json.loads(Path(path).read_text())
        return {str(key): {str(k): float(v) for k, v in counters.items()} for key, counters in doc["keys"].items()}
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        log.warning("usage file %s is unreadable (%s): counting from zero", path, exc)
        return {}


def save(path: str | Path, usage: dict[str, dict[str, float]]) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    atomic_write(Path(path), json.dumps({"version": 1, "keys": usage}, sort_keys=True).encode(), mode=0o600)


def read_all(directory: str | Path) -> dict[str, dict[str, float]]:
    """Every model's file in `directory`, summed per key."""
    total: dict[str, dict[str, float]] = {}
    for path in sorted(Path(directory).glob("*.json")):
        for key, counters in load(path).items():
            into = total.setdefault(key, {})
            for name, value in counters.items():
                into[name] = into.get(name, 0.0) + value
    return total


class UsageSaver:
    """A thread that saves `snapshot()` to `path` every SAVE_EVERY_S while it changes."""

    def __init__(self, path: str | Path, snapshot):
        self.path = Path(path)
        self._snapshot = snapshot
        self._last: dict | None = None
        self._failed = False
        threading.Thread(target=self._run, name="usage-saver", daemon=True).start()

    def _run(self) -> None:
        stop = threading.Event()
        while not stop.wait(SAVE_EVERY_S):
            self.save_if_changed()

    def save_if_changed(self) -> None:
        usage = self._snapshot()
        if usage == self._last:
            return
        try:
            save(self.path, usage)
            self._last, self._failed = usage, False
        except OSError as exc:
            if not self._failed:  # once, not every two seconds
                log.warning("cannot save per-key usage to %s (%s): it is kept in memory only", self.path, exc)
            self._failed = True
