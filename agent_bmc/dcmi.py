"""DCMI power management over IPMI raw commands (pure encoding and decoding; pyghmi has no call for it).

netfn 0x2C, group extension 0xDC; DCMI 1.5 section 6.6.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

NETFN = 0x2C
GROUP = 0xDC
GET_POWER_READING, GET_POWER_LIMIT, SET_POWER_LIMIT, ACTIVATE_POWER_LIMIT = 0x02, 0x03, 0x04, 0x05

COMPLETION_CODES = {
    0x80: "no active power limit is set",
    0x84: "power limit out of range",
    0x85: "correction time out of range",
    0x89: "statistics reporting period out of range",
    0xC1: "the BMC does not support DCMI power management",
    0xC7: "request data length invalid",
    0xC9: "parameter out of range",
    0xCC: "invalid data field in request",
    0xD4: "insufficient privilege",
    0xD5: "command not supported in the present state",
}


def meaning(code: int) -> str:
    return COMPLETION_CODES.get(code, "unknown completion code")


@dataclass(frozen=True)
class PowerReading:
    current_w: int
    minimum_w: int
    maximum_w: int
    average_w: int
    period_ms: int
    active: bool


@dataclass(frozen=True)
class PowerLimit:
    active: bool
    limit_w: int
    correction_ms: int
    sampling_s: int
    exception_action: int


def reading_request() -> tuple[int, ...]:
    return (GROUP, 0x01, 0x00, 0x00)  # mode 1: system power statistics


def decode_reading(data: bytes) -> PowerReading:
    if len(data) < 18 or data[0] != GROUP:
        raise ValueError(f"short or foreign DCMI power reading ({len(data)} bytes)")
    cur, lo, hi, avg = struct.unpack_from("<4H", data, 1)
    _, period = struct.unpack_from("<II", data, 9)
    return PowerReading(cur, lo, hi, avg, period, bool(data[17] & 0x40))


def limit_request() -> tuple[int, ...]:
    return (GROUP, 0x00, 0x00)


def decode_limit(data: bytes, code: int) -> PowerLimit:
    if len(data) < 14 or data[0] != GROUP:
        raise ValueError(f"short or foreign DCMI power limit ({len(data)} bytes)")
    action = data[3]
    limit, correction = struct.unpack_from("<HI", data, 4)
    (sampling,) = struct.unpack_from("<H", data, 12)
    return PowerLimit(code == 0x00, limit, correction, sampling, action)


def set_limit_request(limit_w: int, correction_ms: int = 6000, sampling_s: int = 1,
                      exception_action: int = 0) -> tuple[int, ...]:
    return (GROUP, 0, 0, 0, exception_action) + tuple(struct.pack("<HI", limit_w, correction_ms)) + \
        (0, 0) + tuple(struct.pack("<H", sampling_s))


def activate_request(active: bool) -> tuple[int, ...]:
    return (GROUP, 0x01 if active else 0x00, 0x00, 0x00)
