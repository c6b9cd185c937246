"""Whether a shard host answers as llama.cpp's RPC server of this protocol: its HELLO, asked as ggml asks it,
before ggml is given the endpoint (ggml aborts the whole process on a server it cannot reach or understand).

The wire (ggml-rpc.cpp): a request is | command (1 byte) | size (8 bytes, little-endian) | data |, a response
| size (8 bytes) | data |. HELLO is command 14, always; its request carries the client's 24 bytes of transport
capabilities (zero: plain TCP), its response major, minor, patch, a pad byte and the server's 24.
"""

from __future__ import annotations

import socket
import struct

from host_runtime.gpu.rpc_devices import RPC_PROTOCOL
from host_runtime.shard.errors import ShardError

RPC_CMD_HELLO = 14
CAPS_SIZE = 24
HELLO_TIMEOUT_S = 10.0


def _recv(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


def hello(host: str, port: int, member: str, timeout: float = HELLO_TIMEOUT_S) -> tuple[int, int, int]:
    """The member's protocol version, asked at host:port (the holder's end of the member's tunnel); ShardError
    naming `member` (its LAN address) and what went wrong."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            sock.sendall(struct.pack("<BQ", RPC_CMD_HELLO, CAPS_SIZE) + bytes(CAPS_SIZE))
            (size,) = struct.unpack("<Q", _recv(sock, 8))
            if size != 4 + CAPS_SIZE:
                raise ShardError(f"shard host {member} answered, but not as llama.cpp's RPC server (a HELLO of "
                                 f"{size} bytes)")
            major, minor, patch = _recv(sock, size)[:3]
    except (EOFError, ConnectionResetError):
        raise ShardError(f"shard host {member} closed the connection: it is down, not serving as a shard host, "
                         "or its fleet key differs from this box's") from None
    except TimeoutError:
        raise ShardError(f"shard host {member} did not answer in {timeout:g} s: it is serving another box's model "
                         "(one holder at a time), or the network drops the packets") from None
    except OSError as exc:
        raise ShardError(f"shard host {member}: {exc.strerror or exc}") from None
    if major != RPC_PROTOCOL[0] or minor > RPC_PROTOCOL[1]:
        raise ShardError(f"shard host {member} speaks llama.cpp's RPC protocol {major}.{minor}.{patch}, this box "
                         f"{RPC_PROTOCOL[0]}.{RPC_PROTOCOL[1]}: update the fleet's boxes to one version")
    return major, minor, patch
