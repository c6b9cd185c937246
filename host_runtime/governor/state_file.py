"""The one reader of the governor's published state (governor.json, written by governor/service.py) and its one
freshness rule, for every reader: the scheduler's admission hint (engine/throttle.py), /metrics, the capability
map and the console. A state is fresh while its own `updated_unix` is at most STATE_FRESH_S old: a governor that
stopped publishing must not throttle the box, or show as alive, forever."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

STATE_FRESH_S = 30.0


def is_fresh(updated_unix: float, now: float | None = None) -> bool:
    return (time.time() if now is None else now) - updated_unix <= STATE_FRESH_S


@dataclass(frozen=True)
class GovernorState:
    doc: dict | None     # the file's content, when it could be read
    fresh: bool
    reason: str          # why it is not fresh, or unreadable; "" when fresh

    def get(self, key: str, default=None):
        return (self.doc or {}).get(key, default)


def read_state(path: str | Path | None) -> GovernorState:
    if not path:
        return GovernorState(None, False, "no governor state configured (--governor-state)")
    try:
        doc = json.loads(Path(path).read_text())
        updated = float(doc.get("updated_unix", 0))
    except (OSError, ValueError, TypeError, AttributeError) as exc:
        return GovernorState(None, False, f"the governor's state at {path} cannot be read: "
                                          f"{exc.__class__.__name__}: {exc}")
    if not is_fresh(updated):
        return GovernorState(doc, False, f"the governor's state is {time.time() - updated:.0f} s old")
    return GovernorState(doc, True, "")
