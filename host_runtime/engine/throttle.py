"""The governor's admission hint, read from its state file (re-read only when the file changes)."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from host_runtime.governor.state_file import is_fresh

log = logging.getLogger(__name__)


class ThrottleReader:
    def __init__(self, path: str | None):
        self.path = path
        self._stamp: tuple[int, int] | None = None
        self._level = 0
        self._updated = 0.0

    def level(self) -> int:
        if not self.path:
            return 0
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return 0
        if (st.st_mtime_ns, st.st_size) != self._stamp:
            self._stamp = (st.st_mtime_ns, st.st_size)
            try:
                doc = json.loads(Path(self.path).read_bytes())
                self._level, self._updated = int(doc.get("throttle_level", 0)), float(doc.get("updated_unix", 0))
            except (OSError, ValueError, TypeError) as exc:
                log.warning("ignoring the governor state %s: %s", self.path, exc)
                self._level = 0
        return self._level if is_fresh(self._updated) else 0
