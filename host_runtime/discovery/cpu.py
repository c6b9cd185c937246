"""CPUs: model, sockets, cores, threads, NUMA nodes, and the instruction sets llama.cpp cares about."""

from __future__ import annotations

import platform
from pathlib import Path

import psutil

from host_runtime.common.readings import is_unavailable, read_text, unavailable

# Flags as /proc/cpuinfo spells them (x86 "flags", arm "Features"), mapped to our names.
FLAGS_OF_INTEREST = {"avx2": "avx2", "avx512f": "avx512f", "avx512_vnni": "avx512_vnni",
                     "amx_tile": "amx", "amx_int8": "amx", "asimd": "neon", "neon": "neon", "f16c": "f16c",
                     "fma": "fma"}


def cpuinfo_flags(text: str) -> set[str]:
    """Every flag /proc/cpuinfo lists (x86's "flags", ARM's "Features"; empty where it lists none) (pure)."""
    flags: set[str] = set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            flags.update(value.split())
    return flags


def parse_cpuinfo(text: str) -> dict:
    """Model name, socket ids and flags from /proc/cpuinfo (pure)."""
    model, sockets = None, set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key in ("model name", "Model", "Hardware") and model is None:
            model = value
        elif key == "physical id":
            sockets.add(value)
    flags = cpuinfo_flags(text)
    wanted = sorted({ours for theirs, ours in FLAGS_OF_INTEREST.items() if theirs in flags})
    return {"model": model, "sockets": len(sockets) or 1, "flags": wanted}


def parse_cpulist(text: str) -> list[int]:
    """'0-3,8,10-11' -> [0, 1, 2, 3, 8, 10, 11] (pure)."""
    cpus: list[int] = []
    for part in filter(None, text.strip().split(",")):
        lo, _, hi = part.partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return cpus


def numa_nodes(sys_root: Path = Path("/sys")) -> list[dict] | dict:
    base = sys_root / "devices/system/node"
    if not base.is_dir():
        return unavailable(f"{base} does not exist (kernel without NUMA support)")
    nodes = []
    for node in sorted(base.glob("node[0-9]*"), key=lambda p: int(p.name[4:])):
        cpulist = read_text(node / "cpulist")
        meminfo = read_text(node / "meminfo")
        total = unavailable("no MemTotal line")
        if not is_unavailable(meminfo):
            for line in meminfo.splitlines():
                if "MemTotal:" in line:
                    total = int(line.split()[-2]) * 1024
        try:
            cpus = cpulist if is_unavailable(cpulist) else parse_cpulist(cpulist)
        except ValueError:
            cpus = unavailable(f"unreadable cpulist {cpulist!r}")
        nodes.append({"id": int(node.name[4:]), "cpus": cpus, "memory_total_bytes": total})
    return nodes


def collect_cpu(proc_root: Path = Path("/proc"), sys_root: Path = Path("/sys")) -> dict:
    info = read_text(proc_root / "cpuinfo")
    parsed = parse_cpuinfo(info) if not is_unavailable(info) else {"model": info, "sockets": 1, "flags": []}
    return {
        "model": parsed["model"] or platform.processor() or unavailable("no model name in /proc/cpuinfo"),
        "architecture": platform.machine(),
        "sockets": parsed["sockets"],
        "cores": psutil.cpu_count(logical=False) or unavailable("psutil could not count physical cores"),
        "threads": psutil.cpu_count(logical=True),
        "flags": parsed["flags"],
        "numa_nodes": numa_nodes(sys_root),
    }
