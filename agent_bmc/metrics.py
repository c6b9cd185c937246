"""Prometheus text with ipmi_exporter's names, so existing dashboards work. prometheus_client writes it
(escaping, formats); this module only says which families a snapshot holds."""

from __future__ import annotations

from prometheus_client.core import GaugeMetricFamily

from host_runtime.common.prometheus_text import exposition

FAMILIES = {  # snapshot sensor type -> (metric, help)
    "temperature": ("ipmi_temperature_celsius", "Temperature reading in degree Celsius."),
    "fan": ("ipmi_fan_speed_rpm", "Fan speed in rotations per minute."),
    "voltage": ("ipmi_voltage_volts", "Voltage reading in Volts."),
    "current": ("ipmi_current_amperes", "Current reading in Amperes."),
    "power": ("ipmi_power_watts", "Power reading in Watts."),
}
STATE_VALUE = {"ok": 0, "warning": 1, "critical": 2, "failed": 2}


def families(snapshot: dict) -> list[GaugeMetricFamily]:
    up = GaugeMetricFamily("ipmi_up", "'1' if the BMC answered the last collection, '0' otherwise.",
                           value=1 if snapshot["up"] and not snapshot["stale"] else 0)
    out = [up]
    grouped: dict[str, list[dict]] = {}
    for s in snapshot["sensors"]:
        grouped.setdefault(s["type"] if s["type"] in FAMILIES else "other", []).append(s)
    for kind, sensors in grouped.items():
        known = kind in FAMILIES
        metric, help_text = FAMILIES.get(kind, ("ipmi_sensor_value", "Generic data read from an IPMI sensor."))
        labels = ["id", "name"] + ([] if known else ["type"])
        value = GaugeMetricFamily(metric, help_text, labels=labels)
        state = GaugeMetricFamily(metric.rsplit("_", 1)[0] + "_state" if known else "ipmi_sensor_state",
                                  "Reported state of the sensor (0=nominal, 1=warning, 2=critical).", labels=labels)
        for s in sensors:
            label_values = [str(s["id"]), str(s["name"])] + ([] if known else [str(s["type"])])
            if s["value"] is not None:
                value.add_metric(label_values, s["value"])
            state.add_metric(label_values, STATE_VALUE.get(s["health"], 2))
        out += [value, state]
    power = snapshot.get("power")
    if power and power.get("current_w") is not None:  # {"unavailable": ...} on a BMC without DCMI
        out.append(GaugeMetricFamily("ipmi_dcmi_power_consumption_current_watts",
                                     "Current power consumption (DCMI).", value=power["current_w"]))
    sel = snapshot.get("sel")
    if sel is not None and "count" in sel:
        out.append(GaugeMetricFamily("ipmi_sel_entries_count", "Number of entries in the SEL.", value=sel["count"]))
    return out


def render(snapshot: dict) -> str:
    return exposition(lambda: families(snapshot))
