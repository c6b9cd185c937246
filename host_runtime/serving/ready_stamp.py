"""The engine's last readiness answer, in one place every HTTP worker reads: each worker kept its own, so their
stall timers disagreed (#55); a small file beside the engine's socket, written at each answer."""

from __future__ import annotations

import json
import time
from pathlib import Path

from host_runtime.common.atomic_file import atomic_write
from host_runtime.engine.readiness import Verdict

READY_MARGIN_S = 0.25  # the engine answers this much before the probe's --ready-wait ends


class ReadyStamp:
    def __init__(self, path: str | Path):
        self.path = Path(path)

    def answered(self, verdict: Verdict) -> None:
        try:
            atomic_write(self.path, json.dumps({"at": time.time(), "verdict": verdict.to_wire()}).encode(), mode=0o600)
        except OSError:
            pass  # a full disk: the next question reads the last stamp that was written

    def silence(self) -> tuple[Verdict | None, float]:
        """(the last verdict, seconds since it came); where none came yet, since the first question (stamped now)."""
        try:
            doc = json.loads(self.path.read_text())
            last = Verdict.from_wire(doc["verdict"]) if doc.get("verdict") else None
            return last, max(0.0, time.time() - float(doc["at"]))
        except (OSError, ValueError, KeyError, TypeError):
            try:
                atomic_write(self.path, json.dumps({"at": time.time(), "verdict": None}).encode(), mode=0o600)
            except OSError:
                pass
            return None, 0.0
