"""Prometheus text with ipmi_exporter's names, so existing dashboards work (pure)."""

from __future__ import annotations

FAMILIES = {  # snapshot sensor type -> (metric, help)
    "temperature": ("ipmi_temperature_celsius", "Temperature reading in degree Celsius."),
    "fan": ("ipmi_fan_speed_rpm", "Fan speed in rotations per minute."),
    "voltage": ("ipmi_voltage_volts", "Voltage reading in Volts."),
    "current": ("ipmi_current_amperes", "Current reading in Amperes."),
    "power": ("ipmi_power_watts", "Power reading in Watts."),
}
STATE_VALUE = {"ok": 0, "warning": 1, "critical": 2, "failed": 2}


def _label(value) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"')


def render(snapshot: dict) -> str:
    lines = ["# HELP ipmi_up '1' if the BMC answered the last collection, '0' otherwise.",
             "# TYPE ipmi_up gauge", f"ipmi_up {1 if snapshot['up'] and not snapshot['stale'] else 0}"]
    grouped: dict[str, list[dict]] = {}
    for s in snapshot["sensors"]:
        grouped.setdefault(s["type"] if s["type"] in FAMILIES else "other", []).append(s)
    for kind, sensors in grouped.items():
        metric, help_text = FAMILIES.get(kind, ("ipmi_sensor_value", "Generic data read from an IPMI sensor."))
        lines += [f"# HELP {metric} {help_text}", f"# TYPE {metric} gauge"]
        state_metric = metric.rsplit("_", 1)[0] + "_state" if kind in FAMILIES else "ipmi_sensor_state"
        states = []
        for s in sensors:
            labels = f'id="{_label(s["id"])}",name="{_label(s["name"])}"' + \
                ("" if kind in FAMILIES else f',type="{_label(s["type"])}"')
            if s["value"] is not None:
                lines.append(f"{metric}{{{labels}}} {s['value']}")
            states.append(f"{state_metric}{{{labels}}} {STATE_VALUE.get(s['health'], 2)}")
        lines += [f"# HELP {state_metric} Reported state of the sensor (0=nominal, 1=warning, 2=critical).",
                  f"# TYPE {state_metric} gauge", *states]
    power = snapshot.get("power")
    if power and power.get("current_w") is not None:  # {"unavailable": ...} on a BMC without DCMI
        lines += ["# HELP ipmi_dcmi_power_consumption_current_watts Current power consumption (DCMI).",
                  "# TYPE ipmi_dcmi_power_consumption_current_watts gauge",
                  f"ipmi_dcmi_power_consumption_current_watts {power['current_w']}"]
    sel = snapshot.get("sel")
    if sel is not None and "count" in sel:
        lines += ["# HELP ipmi_sel_entries_count Number of entries in the SEL.", "# TYPE ipmi_sel_entries_count gauge",
                  f"ipmi_sel_entries_count {sel['count']}"]
    return "\n".join(lines) + "\n"
