"""What a member tells the holder beside the RPC wire, on the same port (stunnel routes by the TLS server name,
so it needs no port of its own): what it lends, and the link's speed.

A line protocol, one request a line: `facts` answers one JSON line (this version, the RPC protocol, each lent
device in ggml's order with the bytes it lends); `ping` answers `pong` (the round trip); `bulk N` answers N zero
bytes (the bandwidth, N at most BULK_MAX). Why a member's own word on memory: ggml's CPU device reports all of
the machine's RAM as free, whatever else the box runs.
"""

from __future__ import annotations

import json
import socket
import socketserver
import statistics
import time
from dataclasses import asdict, dataclass

from host_runtime.shard.errors import ShardError

BULK_MAX = 64 << 20
LINK_PINGS = 7
LINK_BULK = 16 << 20
# What a member keeps for itself of a device it lends, at the least (and 5% of it): the holder plans with what is
# lent, with no margin of its own (placement/planner.Device.margin_bytes).
CPU_MARGIN_BYTES = 1 << 30
GPU_MARGIN_BYTES = 512 << 20  # a local card's default margin (engine/limits.py's GPU_MARGIN_MIB)


@dataclass(frozen=True)
class LentDevice:
    name: str           # on the member: CPU, CUDA0, Vulkan0
    description: str
    type: str           # cpu, gpu, igpu
    lend_bytes: int
    total_bytes: int


@dataclass(frozen=True)
class Link:
    round_trip_ms: float
    mbytes_per_s: float

    def __str__(self) -> str:
        return f"{self.round_trip_ms:.2f} ms round trip, {self.mbytes_per_s:.0f} MB/s"


def lendable_bytes(kind: str, free_bytes: int, total_bytes: int, available_bytes: int, cap_bytes: int | None) -> int:
    """What a member lends of one device, never past cap: a GPU its free memory, its CPU the RAM available now
    (ggml's CPU device calls every byte free), each less its margin."""
    if kind == "cpu":
        lent = available_bytes - max(CPU_MARGIN_BYTES, total_bytes // 20)
    else:
        lent = free_bytes - max(GPU_MARGIN_BYTES, total_bytes // 20)
    lent = max(0, lent)
    return min(lent, cap_bytes) if cap_bytes is not None else lent


class _Handler(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        for raw in self.rfile:
            words = raw.decode(errors="replace").split()
            if words == ["facts"]:
                self.wfile.write(json.dumps(self.server.facts()).encode() + b"\n")  # type: ignore[attr-defined]
            elif words == ["ping"]:
                self.wfile.write(b"pong\n")
            elif len(words) == 2 and words[0] == "bulk" and words[1].isdigit() and int(words[1]) <= BULK_MAX:
                self.wfile.write(bytes(int(words[1])))
            else:
                return  # not a holder of ours: nothing more for it
            self.wfile.flush()


class FactsServer(socketserver.ThreadingTCPServer):
    """On 127.0.0.1 (stunnel's facts route connects here); facts() is asked at every `facts`."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, facts):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.facts = facts

    @property
    def port(self) -> int:
        return self.server_address[1]


def _lines(sock: socket.socket):
    return sock.makefile("rb")


def ask(host: str, port: int, member: str, timeout: float = 10.0) -> tuple[list[LentDevice], Link]:
    """The member's lent devices and the link's speed, through the holder's end of its facts route."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            reader = _lines(sock)
            sock.sendall(b"facts\n")
            doc = json.loads(reader.readline() or b"null")
            trips = []
            for _ in range(LINK_PINGS):
                t0 = time.perf_counter()
                sock.sendall(b"ping\n")
                if reader.readline() != b"pong\n":
                    raise EOFError
                trips.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            sock.sendall(f"bulk {LINK_BULK}\n".encode())
            got = 0
            while got < LINK_BULK:
                chunk = reader.read1(min(1 << 20, LINK_BULK - got))
                if not chunk:
                    raise EOFError
                got += len(chunk)
            seconds = time.perf_counter() - t0
    except (OSError, EOFError, ValueError) as exc:
        raise ShardError(f"shard host {member} did not say what it lends ({exc or 'closed'})") from None
    try:
        devices = [LentDevice(**d) for d in doc["devices"]]
    except (TypeError, KeyError) as exc:
        raise ShardError(f"shard host {member} said what it lends in a form this box does not read ({exc})") from None
    median = statistics.median(trips)
    return devices, Link(round(median * 1000, 3), round(LINK_BULK / max(seconds - median, 1e-6) / 1e6, 1))


def facts_doc(devices: list[LentDevice], version: str, protocol: tuple[int, int]) -> dict:
    return {"version": version, "protocol": list(protocol), "devices": [asdict(d) for d in devices]}
