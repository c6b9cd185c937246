"""Host memory and hugepages."""

from __future__ import annotations

from pathlib import Path

import psutil

from host_runtime.common.readings import is_unavailable, read_text


def parse_hugepages(meminfo: str) -> dict:
    """HugePages_* and Hugepagesize from /proc/meminfo (pure)."""
    values = {}
    for line in meminfo.splitlines():
        key, _, rest = line.partition(":")
        if key.startswith("HugePages_") or key == "Hugepagesize":
            parts = rest.split()
            values[key] = int(parts[0]) * (1024 if len(parts) > 1 and parts[1] == "kB" else 1)
    return {"total": values.get("HugePages_Total", 0), "free": values.get("HugePages_Free", 0),
            "page_size_bytes": values.get("Hugepagesize", 0)}


def collect_memory(proc_root: Path = Path("/proc")) -> dict:
    vm = psutil.virtual_memory()
    meminfo = read_text(proc_root / "meminfo")
    return {"total_bytes": vm.total, "available_bytes": vm.available,
            "hugepages": meminfo if is_unavailable(meminfo) else parse_hugepages(meminfo)}
