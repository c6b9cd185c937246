"""AMD cards: pyamdgpuinfo for what discovery records, the amdgpu hwmon files for what the governor reads and
sets; both name a card by its PCI address. Units in hwmon: temperature in m°C, power in µW."""

from __future__ import annotations

from pathlib import Path

from host_runtime.common.readings import is_unavailable, read_int, unavailable
from host_runtime.common.pci import normalize_address


def snapshot(sys_root: Path = Path("/sys")) -> tuple[list[dict], dict]:
    try:
        import pyamdgpuinfo

        count = pyamdgpuinfo.detect_gpus()
    except ImportError:
        return [], unavailable("pyamdgpuinfo is not installed")
    except Exception as exc:  # it raises FileNotFoundError when /dev/dri is absent, RuntimeError otherwise
        return [], unavailable(str(exc))
    raw = []
    for i in range(count):
        gpu = pyamdgpuinfo.get_gpu(i)
        raw.append({"index": i, "name": getattr(gpu, "name", None), "pci_slot": gpu.pci_slot,
                    "memory_info": dict(gpu.memory_info), "hwmon": power_cap(gpu.pci_slot, sys_root)})
    return raw, {"available": True}


def hwmon_dir(pci_slot: str, sys_root: Path = Path("/sys")) -> Path | None:
    hwmons = sorted((sys_root / "bus/pci/devices" / pci_slot / "hwmon").glob("hwmon*"))
    return hwmons[0] if hwmons else None


def power_cap(pci_slot: str, sys_root: Path = Path("/sys")) -> dict:
    h = hwmon_dir(pci_slot, sys_root)
    if h is None:
        return unavailable("no amdgpu hwmon directory")
    return {k: read_int(h / f"power1_cap{suffix}") for k, suffix in
            (("current", ""), ("max", "_max"), ("min", "_min"), ("default", "_default"))}


def translate(raw: dict) -> dict:
    """pyamdgpuinfo's values in the topology's form (pure). Power caps in hwmon are microwatts."""
    hw = raw["hwmon"]

    def watts(v):
        return v if is_unavailable(v) else round(v / 1e6, 3)

    return {
        "backend": "amdgpu", "index": raw["index"], "name": raw["name"] or unavailable("libdrm gave no name"),
        "pci_address": normalize_address(raw["pci_slot"]),
        "vram_total_bytes": raw["memory_info"].get("vram_size", unavailable("no vram_size")),
        "power_limit_w": hw if is_unavailable(hw) else {k: watts(v) for k, v in hw.items()},
    }


def hwmon_cards(sys_root: Path = Path("/sys")) -> dict[str, Path]:
    """Every card the amdgpu driver runs, by PCI address, with its hwmon directory."""
    cards = {}
    for hw in sorted(sys_root.glob("class/drm/card[0-9]*/device/hwmon/hwmon*")):
        if (hw / "name").exists() and (hw / "name").read_text().strip() == "amdgpu":
            cards[normalize_address(hw.parent.parent.resolve().name)] = hw
    return cards


def _int(path: Path) -> int | None:
    value = read_int(path)
    return None if is_unavailable(value) else value


def limits_w(hw: Path) -> tuple[float, float, float]:
    lo, hi = _int(hw / "power1_cap_min") or 0, _int(hw / "power1_cap_max") or 0
    default = _int(hw / "power1_cap_default") or hi
    return lo / 1e6, hi / 1e6, default / 1e6


def sample(hw: Path) -> dict:
    t, p, cap = _int(hw / "temp1_input"), _int(hw / "power1_average"), _int(hw / "power1_cap")
    device = hw.parent.parent
    return {"temperature_c": t / 1000 if t is not None else None, "power_w": p / 1e6 if p is not None else None,
            "limit_w": cap / 1e6 if cap is not None else None, "hw_slowdown": False,
            "vram_used_bytes": _int(device / "mem_info_vram_used"), "vram_total_bytes": _int(device / "mem_info_vram_total")}


def set_limit_w(hw: Path, watts: float) -> None:
    """Raises OSError where the kernel refuses (the caller maps it to its own error)."""
    (hw / "power1_cap").write_text(str(int(watts * 1e6)))
