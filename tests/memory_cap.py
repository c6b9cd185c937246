"""A memory limit on one process from now on (a box with little RAM, made on demand): cgroup v2's memory.max where
the memory controller is available, else cgroup v1's memory.limit_in_bytes. Pages the process touched before it
moved stay charged where they were, so the limit bounds what it allocates after. Needs root; removed by lift()."""

from __future__ import annotations

import os
from pathlib import Path

CGROUP = Path("/sys/fs/cgroup")


def _v2_parent() -> Path | None:
    own = next((line.split(":", 2)[2] for line in Path("/proc/self/cgroup").read_text().splitlines()
                if line.startswith("0::")), None)
    if own is None or not (CGROUP / "cgroup.controllers").exists():
        return None
    group = CGROUP / own.lstrip("/")
    try:
        return group if "memory" in (group / "cgroup.controllers").read_text().split() else None
    except OSError:
        return None


class MemoryCap:
    def __init__(self, pid: int, limit_bytes: int, name: str):
        parent = _v2_parent()
        if parent is not None:
            if "memory" not in (parent / "cgroup.subtree_control").read_text().split():
                (parent / "cgroup.subtree_control").write_text("+memory\n")
            self.group = parent / name
            self.group.mkdir(exist_ok=True)
            (self.group / "memory.max").write_text(f"{limit_bytes}\n")
            try:
                (self.group / "memory.swap.max").write_text("0\n")  # over the limit is over, not swapped
            except OSError:
                pass  # no swap accounting: no swap to fall back on either
            self._usage = "memory.current"
        else:
            self.group = CGROUP / "memory" / name
            self.group.mkdir(exist_ok=True)
            (self.group / "memory.limit_in_bytes").write_text(f"{limit_bytes}\n")
            self._usage = "memory.usage_in_bytes"
        (self.group / "cgroup.procs").write_text(f"{pid}\n")

    def usage(self) -> int:
        """Bytes charged to the group: what the process allocated since it moved."""
        return int((self.group / self._usage).read_text())

    def lift(self) -> None:
        try:
            for pid in (self.group / "cgroup.procs").read_text().split():
                try:
                    (self.group.parent / "cgroup.procs").write_text(f"{pid}\n")
                except OSError:
                    pass
            os.rmdir(self.group)
        except OSError:
            pass
