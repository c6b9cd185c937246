"""Test equipment: an OpenIPMI `ipmi_sim` BMC on 127.0.0.1 with sensors, SEL, FRU and (via a plugin) DCMI.

Sensor records (SDR type 01h, IPMI 2.0 table 43-1) are built here and added with
`main_sdr_add`; readings and thresholds are set with the simulator's own commands, and
changed at run time through its TCP console (`sensor_set_value`).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from host_runtime.common.processes import stop_process

BMC = 0x20
USER, PASSWORD = "admin", "ec-test-pw"
HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class SimSensor:
    number: int
    name: str
    sensor_type: int    # 1 temperature, 2 voltage, 3 current, 4 fan, 0x0B other (watts)
    unit: int           # 1 degrees C, 4 volts, 5 amps, 6 watts, 18 RPM
    m: int              # reading = m * raw * 10^r_exp
    r_exp: int
    raw: int            # initial raw reading
    upper: tuple[int, int, int]  # raw (non-critical, critical, non-recoverable)


SENSORS = [
    SimSensor(1, "Inlet Temp", 0x01, 1, 1, 0, 24, (40, 45, 50)),
    SimSensor(2, "Exhaust Temp", 0x01, 1, 1, 0, 38, (60, 70, 80)),
    SimSensor(3, "FAN1", 0x04, 18, 60, 0, 50, (200, 220, 240)),
    SimSensor(4, "12V", 0x02, 4, 1, -1, 120, (130, 135, 140)),
    SimSensor(5, "PSU1 Current", 0x03, 5, 1, -1, 85, (200, 220, 240)),
    SimSensor(6, "PSU1 Power", 0x0B, 6, 4, 0, 55, (200, 220, 240)),
]


def full_sensor_record(s: SimSensor) -> list[int]:
    name = s.name.encode()
    body = [
        BMC, 0x00, s.number,            # owner, LUN, sensor number
        0x07, 0x01,                     # entity: system board, instance 1
        0x7F, 0x68,                     # init: scanning/events/thresholds; caps: auto re-arm, thresholds readable+settable
        s.sensor_type, 0x01,            # threshold-based
        0x00, 0x00, 0x00, 0x00,         # event masks (none)
        0x38, 0x38,                     # readable and settable: UNC, UC, UNR
        0x00, s.unit, 0x00, 0x00,       # unsigned, base unit, no modifier, linear
        s.m & 0xFF, (s.m >> 2) & 0xC0,  # M (10 bits), tolerance 0
        0x00, 0x00, 0x00,               # B = 0, accuracy 0, direction n/a
        ((s.r_exp & 0xF) << 4),         # R exponent, B exponent 0
        0x00, 0x00, 0x00, 0x00,         # analog flags, nominal, normal max/min
        0xFF, 0x00,                     # sensor max / min reading
        s.upper[2], s.upper[1], s.upper[0], 0x00, 0x00, 0x00,  # UNR UC UNC LNR LC LNC
        0x00, 0x00, 0x00, 0x00, 0x00,   # hysteresis +/-, reserved x2, OEM
        0xC0 | len(name), *name,        # ID string, 8-bit ASCII
    ]
    return [0x00, 0x00, 0x51, 0x01, len(body)] + body


def emu_commands() -> str:
    lines = [f"mc_setbmc {BMC:#x}",
             f"mc_add {BMC:#x} 0 no-device-sdrs 0x23 9 8 0x9f 0x1291 0xf02",
             f"sel_enable {BMC:#x} 1000 0x0a"]
    for s in SENSORS:
        lines.append(f"main_sdr_add {BMC:#x} " + " ".join(f"{b:#04x}" for b in full_sensor_record(s)))
        lines.append(f"sensor_add {BMC:#x} 0 {s.number} {s.sensor_type:#x} 0x01")
        lines.append(f"sensor_set_threshold {BMC:#x} 0 {s.number} settable 111000 "
                     f"{s.upper[2]:#x} {s.upper[1]:#x} {s.upper[0]:#x} 00 00 00")
        lines.append(f"sensor_set_value {BMC:#x} 0 {s.number} {s.raw:#x} 0")
    # A small FRU: board area with a manufacturer and product name (IPMI FRU spec 1.0).
    fru = fru_image("EveryCycle Test", "SimBoard 1")
    lines.append(f"mc_add_fru_data {BMC:#x} 0 {len(fru)} data " + " ".join(f"{b:#04x}" for b in fru))
    lines.append(f"mc_enable {BMC:#x}")
    return "\n".join(lines) + "\n"


def _fru_field(text: str) -> list[int]:
    data = text.encode()
    return [0xC0 | len(data), *data]


def _checksum(data: list[int]) -> int:
    return (-sum(data)) & 0xFF


def fru_image(manufacturer: str, product: str) -> list[int]:
    board = [0x01, 0x00, 0x19, 0x00, 0x00, 0x00]  # version, length (fixed below), language, mfg date
    board += _fru_field(manufacturer) + _fru_field(product) + _fru_field("SN0001") + _fru_field("PN-42") + [0x00, 0xC1]
    while (len(board) + 1) % 8:
        board.append(0x00)
    board[1] = (len(board) + 1) // 8
    board.append(_checksum(board))
    header = [0x01, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00]  # board area at offset 8 (in multiples of 8)
    header[7] = _checksum(header[:7])
    return header + board


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_tcp_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_dcmi_plugin(outdir: Path) -> Path:
    """Compile the DCMI test plugin (tests/equipment/ipmi_sim_dcmi.c) for ipmi_sim's loadlib."""
    out = outdir / "ipmi_sim_dcmi.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-o", str(out), str(HERE / "ipmi_sim_dcmi.c")], check=True,
                   capture_output=True)
    return out


class IpmiSim:
    """One ipmi_sim process with its own config, state directory and console port."""

    def __init__(self, workdir: Path, with_dcmi: bool = True):
        self.workdir = workdir
        self.port = free_udp_port()
        self.console_port = free_tcp_port()
        state = workdir / "state"
        state.mkdir(parents=True, exist_ok=True)
        plugin = f'loadlib "{build_dcmi_plugin(workdir)}" "watts=220"\n' if with_dcmi else ""
        (workdir / "lan.conf").write_text(f'''name "ecsim"
set_working_mc 0x20
  startlan 1
    addr 127.0.0.1 {self.port}
    priv_limit admin
    allowed_auths_callback none md5
    allowed_auths_user none md5
    allowed_auths_operator none md5
    allowed_auths_admin none md5
    guid a123456789abcdefa123456789abcdef
  endlan
  user 2 true "{USER}" "{PASSWORD}" admin 10 none md5
console 127.0.0.1 {self.console_port}
{plugin}''')
        (workdir / "sim.emu").write_text(emu_commands())
        self.log = open(workdir / "ipmi_sim.log", "wb")
        self.proc = subprocess.Popen(["ipmi_sim", "-c", str(workdir / "lan.conf"), "-f", str(workdir / "sim.emu"),
                                      "-s", str(state), "-n"], stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.ipmitool("mc", "info").returncode == 0:
                return
            time.sleep(0.2)
        raise RuntimeError(f"ipmi_sim did not come up: {(workdir / 'ipmi_sim.log').read_text()[-2000:]}")

    def ipmitool(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["ipmitool", "-I", "lanplus", "-C", "3", "-H", "127.0.0.1", "-p", str(self.port),
                               "-U", USER, "-P", PASSWORD, *args], capture_output=True, text=True, timeout=30)

    def console(self, command: str) -> str:
        """Run an emulator command (sensor_set_value, sel_add, ...) through the simulator's console."""
        with socket.create_connection(("127.0.0.1", self.console_port), timeout=5) as s:
            s.sendall(command.encode() + b"\n")
            time.sleep(0.2)
            s.settimeout(0.5)
            try:
                return s.recv(4096).decode(errors="replace")
            except socket.timeout:
                return ""

    def set_raw(self, sensor: int, raw: int) -> None:
        self.console(f"sensor_set_value {BMC:#x} 0 {sensor} {raw:#x} 1")

    def pause(self) -> None:
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)  # a paused simulator cannot act on SIGTERM
        stop_process(self.proc, 10)
        self.log.close()


def available() -> bool:
    return shutil.which("ipmi_sim") is not None and shutil.which("ipmitool") is not None
