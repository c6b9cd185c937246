"""The update record: what the last update did, kept on the data partition (it outlives both slots).

One JSON object, written atomically: the target version, the version it started from, the phase, a reason, the
times, and the earlier records (the last ten). `everycycle update apply` writes it as it goes; at each boot
`reconcile` turns what the boot loader did into an outcome (booted, rolled back, interrupted); the health gate
marks the new slot blessed. /health, `everycycle update status` and the console read it.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from pathlib import Path

from host_runtime.common.atomic_file import atomic_write
from host_runtime.update import versioning

# Phases while an update runs, and its outcomes.
STAGING, WRITING, INSTALLED, BOOTING = "staging", "writing", "installed", "booting"
BLESSED, ROLLED_BACK, REFUSED, FAILED, INTERRUPTED = "blessed", "rolled-back", "refused", "failed", "interrupted"
IN_APPLY = (STAGING, WRITING)
HISTORY = 10

_ENTRY = re.compile(re.escape(versioning.UKI_PREFIX) + r"(.+?)(?:\+(\d+)(?:-(\d+))?)?\.efi")


@dataclass(frozen=True)
class BootEntry:
    """A unified kernel image on the ESP, as systemd-boot counts its tries (everycycle_<v>+<left>-<done>.efi)."""

    name: str
    version: str
    tries_left: int | None  # None: not counted (blessed, or the image's first)
    tries_done: int

    @property
    def bad(self) -> bool:
        """systemd-boot boots an entry with no tries left only when nothing else is there."""
        return self.tries_left == 0


def parse_entry(name: str) -> BootEntry | None:
    m = _ENTRY.fullmatch(name)
    if not m:
        return None
    version, left, done = m.groups()
    return BootEntry(name, version, int(left) if left is not None else None, int(done or 0))


def entries_in(directory: Path) -> list[BootEntry]:
    try:
        names = sorted(p.name for p in directory.iterdir())
    except OSError:
        return []
    return [e for e in map(parse_entry, names) if e]


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def load(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def save(path: Path, record: dict) -> None:
    atomic_write(path, (json.dumps(record, indent=2) + "\n").encode(), mode=0o644)


def begin(previous: dict, target: str, running: str) -> dict:
    """A new record for an update from `running` to `target`; the previous one goes into the history."""
    history = ([{k: v for k, v in previous.items() if k != "history"}] if previous.get("phase") else [])
    history += previous.get("history", [])
    return {"target": target, "from": running, "phase": STAGING, "reason": "", "started_at": now_iso(),
            "updated_at": now_iso(), "history": history[:HISTORY]}


def advance(record: dict, phase: str, reason: str = "", **extra) -> dict:
    return {**record, **extra, "phase": phase, "reason": reason, "updated_at": now_iso()}


def reconcile(record: dict, running: str | None, entries: list[BootEntry]) -> dict:
    """At boot: what became of the update the record describes, given the running version and the ESP's boot
    entries (pure). Returns the record unchanged where there is nothing new to say."""
    phase, target = record.get("phase"), record.get("target")
    if not target or running is None:
        return record
    entry = next((e for e in entries if e.version == target), None)
    if phase in IN_APPLY:
        # Nothing runs at boot: an apply that had not finished was cut off (power, reset). sysupdate names
        # the slot and installs the kernel image last, so the box is on the slot it was on.
        doing = {STAGING: "copied", WRITING: "written"}[phase]
        return advance(record, INTERRUPTED, f"the box restarted while the update was being {doing}; "
                                            f"{target} was not installed and {running} kept serving")
    if phase in (INSTALLED, BOOTING):
        if running == target:
            return record if phase == BOOTING else advance(record, BOOTING, "booted; waiting for the health gate")
        if entry is None:
            return advance(record, FAILED, f"{target}'s boot entry is gone; running {running}")
        if entry.bad:
            last = record.get("gate", "")
            return advance(record, ROLLED_BACK, f"{target} did not pass its health gate in "
                                                f"{entry.tries_done} boots{': ' + last if last else ''}; back on "
                                                f"{running}")
    return record
