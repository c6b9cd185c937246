"""The agent's snapshot, as other services read it: the one piece of the agent they share.

`GET /telemetry` returns {"schema_version": 1, "state", "up", "stale", "age_s", "sensors": [{"id",
"name", "type", "value", "units", "health", "states", "thresholds"}], "power", "power_limit",
"sel", "fru", "events", "fan_policy"}.
"""

from __future__ import annotations

SCHEMA_VERSION = 1


def chassis_temperature(snapshot: dict, role: str) -> float | None:
    """The reading of the temperature sensor named for `role` ("inlet", "exhaust"), if fresh and sane."""
    if snapshot.get("schema_version") != SCHEMA_VERSION or snapshot.get("stale", True):
        return None
    for sensor in snapshot.get("sensors", []):
        if sensor.get("type") == "temperature" and role in str(sensor.get("name", "")).lower() \
                and sensor.get("value") is not None and sensor.get("health") != "failed":
            return float(sensor["value"])
    return None
