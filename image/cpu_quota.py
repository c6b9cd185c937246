"""A CPU quota on one process (the qemu of a boot check): a slow box made on demand, to show that readiness
tells slow from wedged. cgroup v2 (`cpu.max`) where the cpu controller is delegated, else cgroup v1's
`cpu.cfs_quota_us`. Needs root; the group is removed when the quota is lifted.
"""

from __future__ import annotations

import os
from pathlib import Path

PERIOD_US = 100_000
CGROUP = Path("/sys/fs/cgroup")


class QuotaUnavailable(Exception):
    """Neither cgroup version offers a cpu controller here."""


class CpuQuota:
    def __init__(self, pid: int, percent: float, name: str):
        """Limit pid (and its threads) to percent of one CPU (200 = two CPUs' worth)."""
        if not 0 < percent:
            raise ValueError(f"the CPU quota must be more than 0%, not {percent}")
        quota = max(1000, int(PERIOD_US * percent / 100))
        self.group = self._make(name, quota)
        (self.group / "cgroup.procs").write_text(f"{pid}\n")
        self.percent = percent

    @staticmethod
    def _make(name: str, quota_us: int) -> Path:
        parent = _v2_group()
        if parent is not None:
            try:
                if "cpu" not in (parent / "cgroup.subtree_control").read_text().split():
                    (parent / "cgroup.subtree_control").write_text("+cpu\n")
                group = parent / name
                group.mkdir(exist_ok=True)
                (group / "cpu.max").write_text(f"{quota_us} {PERIOD_US}\n")
                return group
            except OSError:
                pass  # processes in our own group ("no internal processes"), or not delegated: try v1
        v1 = CGROUP / "cpu"
        if (v1 / "cpu.cfs_quota_us").exists():
            group = v1 / name
            group.mkdir(exist_ok=True)
            (group / "cpu.cfs_period_us").write_text(f"{PERIOD_US}\n")
            (group / "cpu.cfs_quota_us").write_text(f"{quota_us}\n")
            return group
        raise QuotaUnavailable("no cgroup cpu controller to limit qemu with (cgroup v2 cpu.max or v1 "
                               "cpu.cfs_quota_us)")

    def lift(self) -> None:
        """Move what is left back to the root group and remove ours."""
        root = self.group.parent
        try:
            for pid in (self.group / "cgroup.procs").read_text().split():
                try:
                    (root / "cgroup.procs").write_text(f"{pid}\n")
                except OSError:
                    pass
            os.rmdir(self.group)
        except OSError:
            pass


def unavailable() -> str | None:
    """Why this machine cannot limit a process's CPU here, or None when it can (root and a cpu controller)."""
    if os.geteuid() != 0:
        return "not root"
    if _v2_group() is None and not (CGROUP / "cpu" / "cpu.cfs_quota_us").exists():
        return "no cgroup cpu controller (cgroup v2 cpu.max or v1 cpu.cfs_quota_us)"
    return None


def _v2_group() -> Path | None:
    """This process's cgroup v2 directory, where the cpu controller is available to it."""
    own = next((line.split(":", 2)[2] for line in Path("/proc/self/cgroup").read_text().splitlines()
                if line.startswith("0::")), None)
    for root in (CGROUP, CGROUP / "unified"):
        if own is not None and (root / "cgroup.controllers").exists():
            group = root / own.lstrip("/")
            try:
                return group if "cpu" in (group / "cgroup.controllers").read_text().split() else None
            except OSError:
                return None
    return None
