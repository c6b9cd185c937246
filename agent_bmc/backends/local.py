"""Boards without a BMC: temperatures, fans and power from hwmon (psutil, /sys/class/hwmon)."""

from __future__ import annotations

from pathlib import Path

import psutil


def _health(value: float, high: float | None, critical: float | None) -> str:
    if critical and value >= critical:
        return "critical"
    if high and value >= high:
        return "warning"
    return "ok"


class LocalBackend:
    name = "local"

    def __init__(self, sys_root: Path = Path("/sys")):
        self.sys_root = sys_root

    def sensors(self) -> list[dict]:
        out = []
        for chip, entries in (psutil.sensors_temperatures() or {}).items():
            for i, t in enumerate(entries):
                name = f"{chip} {t.label or i}"
                out.append({"id": name, "name": name, "type": "temperature", "value": t.current, "units": "°C",
                            "health": _health(t.current, t.high, t.critical), "states": [],
                            "thresholds": {k: v for k, v in (("upper_non_critical", t.high),
                                                             ("upper_critical", t.critical)) if v}})
        for chip, entries in (psutil.sensors_fans() or {}).items():
            for i, f in enumerate(entries):
                name = f"{chip} {f.label or i}"
                out.append({"id": name, "name": name, "type": "fan", "value": f.current, "units": "RPM",
                            "health": "ok", "states": [], "thresholds": {}})
        for power in sorted(self.sys_root.glob("class/hwmon/hwmon*/power*_input")):
            try:
                watts = int(power.read_text()) / 1e6
                chip = (power.parent / "name").read_text().strip()
            except (OSError, ValueError):
                continue
            name = f"{chip} {power.name.split('_')[0]}"
            out.append({"id": name, "name": name, "type": "power", "value": watts, "units": "W", "health": "ok",
                        "states": [], "thresholds": {}})
        return out
