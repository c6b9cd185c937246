"""IPMI over LAN with pyghmi: sensors with thresholds, DCMI power, SEL, FRU, power limit, fan duty.

pyghmi calls can block for 27-30 s on a dead BMC; the coordinator runs every call of this
class under its own deadline and throws the session away after one, so nothing here waits
on its own. Credentials go to pyghmi as bytes (as str, a timed-out session stays cached).
"""

from __future__ import annotations

import socket

from agent_bmc import dcmi
from agent_bmc.errors import BmcAuthFailed, BmcCommandFailed, BmcError, BmcUnknownHost, BmcUnreachable
from agent_bmc.fan_curve import RawFanCommand

FRU_CHUNK = 16  # some BMCs refuse long FRU reads (pyghmi asks for 224 bytes at once)
HEALTH = {0: "ok", 1: "warning", 2: "critical", 4: "failed"}
TYPES = {"temperature": "temperature", "fan": "fan", "voltage": "voltage", "current": "current"}
THRESHOLD_NAMES = ("lower_non_critical", "lower_critical", "lower_non_recoverable",
                   "upper_non_critical", "upper_critical", "upper_non_recoverable")


def map_connect_error(exc: Exception, where: str = "") -> BmcError:
    """pyghmi's and the socket layer's failures, as the agent's own states."""
    if isinstance(exc, socket.gaierror):
        return BmcUnknownHost(f"unknown BMC host {where}: {exc}".replace("  ", " "))
    text = str(exc) if str(exc) not in ("", "None") else f"no IPMI answer from {where or 'the BMC'}"
    low = text.lower()
    if any(k in low for k in ("unauthorized name", "incorrect password", "password", "rakp", "authentication",
                              "privilege")):
        return BmcAuthFailed(f"the BMC refused the credentials: {text}")
    return BmcUnreachable(f"the BMC does not answer: {text}")


def health_of(bits: int) -> str:
    for bit in (4, 2, 1):
        if bits & bit:
            return HEALTH[bit]
    return "ok"


class IpmiBackend:
    name = "ipmi"

    def __init__(self, host: str, port: int, user: str, password: str, fan_command: RawFanCommand | None = None):
        self.host, self.port = host, port
        self._user, self._password = user.encode(), password.encode()
        self.fan_command = fan_command
        self._cmd = None

    # ---- session ---------------------------------------------------------------

    def connect(self):
        from pyghmi.ipmi import command

        try:
            self._cmd = command.Command(bmc=self.host, userid=self._user, password=self._password, port=self.port)
        except Exception as exc:  # pyghmi raises IpmiException, socket errors, and plain Exceptions
            self._cmd = None
            raise map_connect_error(exc, f"{self.host}:{self.port}") from None
        return self._cmd

    @property
    def has_session(self) -> bool:
        """A session is open (with its SDR cache): the next collection is a warm one."""
        return self._cmd is not None

    def drop(self) -> None:
        """Forget the session: after a timeout it is dead for good (pyghmi never revives it)."""
        self._cmd = None

    def _raw(self, netfn: int, command: int, data: tuple, what: str, ok_codes=(0,)) -> dict:
        rsp = self._cmd.raw_command(netfn=netfn, command=command, data=data)
        code = rsp.get("code", 0)
        if code not in ok_codes:
            meaning = dcmi.meaning(code) if netfn == dcmi.NETFN else rsp.get("error", "error")
            raise BmcCommandFailed(what, code, meaning)
        return rsp

    # ---- reads -----------------------------------------------------------------

    def sensors(self) -> list[dict]:
        from pyghmi.exceptions import IpmiException

        cmd = self._cmd or self.connect()
        out = []
        try:
            readings = list(cmd.get_sensor_data())
            entries = {e.sensor_name: e for e in cmd._sdr.sensors.values() if hasattr(e, "sensor_number")}
        except IpmiException as exc:
            raise map_connect_error(exc) from None
        for r in readings:
            kind = TYPES.get(str(r.type).lower()) or ("power" if r.units == "W" else str(r.type).lower())
            entry = entries.get(r.name)
            out.append({"id": str(entry.sensor_number) if entry else r.name, "name": r.name, "type": kind,
                        "value": None if r.unavailable else r.value, "units": r.units,
                        "health": health_of(r.health), "states": list(r.states),
                        "thresholds": self._thresholds(entry) if entry is not None else {}})
        return out

    def _thresholds(self, entry) -> dict:
        rsp = self._cmd.raw_command(netfn=0x04, command=0x27, data=(entry.sensor_number,))
        if rsp.get("code") or len(rsp.get("data", b"")) < 7:
            return {}
        mask, raw = rsp["data"][0], rsp["data"][1:7]
        return {name: entry.decode_value(self._cmd, raw[i]) for i, name in enumerate(THRESHOLD_NAMES)
                if mask & (1 << i)}

    def power(self) -> dict | None:
        rsp = self._cmd.raw_command(netfn=dcmi.NETFN, command=dcmi.GET_POWER_READING, data=dcmi.reading_request())
        if rsp.get("code"):
            return {"unavailable": dcmi.meaning(rsp["code"])}
        r = dcmi.decode_reading(bytes(rsp["data"]))
        return {"current_w": r.current_w, "minimum_w": r.minimum_w, "maximum_w": r.maximum_w,
                "average_w": r.average_w, "active": r.active}

    def power_limit(self) -> dict:
        rsp = self._raw(dcmi.NETFN, dcmi.GET_POWER_LIMIT, dcmi.limit_request(), "Get Power Limit", ok_codes=(0, 0x80))
        lim = dcmi.decode_limit(bytes(rsp["data"]), rsp.get("code", 0))
        return {"active": lim.active, "limit_w": lim.limit_w, "correction_ms": lim.correction_ms,
                "sampling_s": lim.sampling_s, "exception_action": lim.exception_action}

    def set_power_limit(self, watts: int, correction_ms: int = 6000, sampling_s: int = 1, activate: bool = True):
        self._cmd or self.connect()
        self._raw(dcmi.NETFN, dcmi.SET_POWER_LIMIT, dcmi.set_limit_request(watts, correction_ms, sampling_s),
                  "Set Power Limit")
        self._raw(dcmi.NETFN, dcmi.ACTIVATE_POWER_LIMIT, dcmi.activate_request(activate), "Activate Power Limit")

    def sel(self) -> list[dict]:
        return [{k: e.get(k) for k in ("record_id", "timestamp", "component", "component_type", "event", "severity",
                                         "deassertion")} for e in self._cmd.get_event_log(clear=False)]

    def fru(self) -> dict:
        """FRU 0 read 16 bytes at a time, parsed by pyghmi."""
        from pyghmi.ipmi.fru import FRU

        info = self._raw(0x0A, 0x10, (0,), "Get FRU Inventory Area Info")["data"]
        size = info[0] | (info[1] << 8)
        data = bytearray()
        while len(data) < size:
            count = min(FRU_CHUNK, size - len(data))
            chunk = self._raw(0x0A, 0x11, (0, len(data) & 0xFF, len(data) >> 8, count), "Read FRU Data")["data"]
            if not chunk or chunk[0] == 0:
                break
            data += bytes(chunk[1:1 + chunk[0]])
        parsed = FRU(rawdata=bytes(data)).info or {}
        return {k: v for k, v in parsed.items() if isinstance(v, (str, int, float)) and v != ""}

    def set_fan_duty(self, duty: int) -> None:
        if self.fan_command is None:
            raise BmcCommandFailed("set fan duty", 0xC1, "no vendor fan command is configured")
        command, data = self.fan_command.render(duty)
        self._raw(self.fan_command.netfn, command, data, "vendor fan duty")
