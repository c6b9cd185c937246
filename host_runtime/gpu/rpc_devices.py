"""llama.cpp's RPC backend through ggml's registry (ctypes): lending this process's devices to another box, and
adding another box's devices to this process's registry, as llama.cpp's rpc-server and `--rpc` do.

Both are ggml's own functions, reached through the RPC backend's proc addresses (common/arg.cpp's
add_rpc_devices). ggml aborts the process when it cannot connect to a server or the server speaks another
protocol: callers probe a server first (host_runtime/shard/probe.py).
"""

from __future__ import annotations

import ctypes
from host_runtime.common.errors import UnavailableError
from host_runtime.gpu.llama_devices import (REMOTE_DEVICES, LlamaDevice, RemoteView, device_handles, ggml_library,
                                            list_devices)

# ggml-rpc.h's RPC_PROTO_MAJOR_VERSION and _MINOR_VERSION in the pinned llama.cpp (a client accepts a server of
# the same major and a minor no newer than its own); tests/test_shard.py asks a real server for them, so a pin
# that changes the protocol fails there until this says so.
RPC_PROTOCOL = (7, 0)


def is_remote(device_name: str) -> bool:
    """Whether a device of a placement is another box's: ggml names every RPC device RPC<n>."""
    return device_name.startswith("RPC") and device_name[3:].isdigit()


class RpcBackendError(UnavailableError):
    """This llama.cpp build has no RPC backend, or it refused what was asked."""


def _rpc_reg(lib) -> int:
    lib.ggml_backend_reg_by_name.argtypes = [ctypes.c_char_p]
    lib.ggml_backend_reg_by_name.restype = ctypes.c_void_p
    lib.ggml_backend_reg_get_proc_address.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.ggml_backend_reg_get_proc_address.restype = ctypes.c_void_p
    reg = lib.ggml_backend_reg_by_name(b"RPC")
    if not reg:
        raise RpcBackendError("this llama.cpp was built without its RPC backend (GGML_RPC): rebuild the venv "
                              "with `make install`")
    return reg


def _proc(lib, name: str, prototype):
    address = lib.ggml_backend_reg_get_proc_address(_rpc_reg(lib), name.encode())
    if not address:
        raise RpcBackendError(f"llama.cpp's RPC backend has no {name}")
    return prototype(address)


def devices_to_lend() -> list[tuple[int, LlamaDevice]]:
    """What a box lends, as llama.cpp's rpc-server chooses by default: its GPUs, or its CPU where it has none;
    never a device it borrows itself. (handle, device) pairs."""
    handles = device_handles()
    own = [d for d in list_devices(include_cpu=True) if d.backend != "RPC"]
    chosen = [d for d in own if d.type in ("gpu", "igpu")] or [d for d in own if d.type == "cpu"]
    return [(handles[d.index], d) for d in chosen]


def serve(endpoint: str, cache_dir: str | None, n_threads: int, devices: list[int]) -> None:
    """Serve these devices on endpoint (HOST:PORT) until the process ends: one client at a time, as ggml's
    server does; a client's buffers are freed when it disconnects. cache_dir: where tensors sent by hash are
    kept (a reload of the same weights sends hashes), None for none. Returns only if the server could not start
    (ggml says why on stderr)."""
    lib = ggml_library()
    start = _proc(lib, "ggml_backend_rpc_start_server",
                  ctypes.CFUNCTYPE(None, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t,
                                   ctypes.POINTER(ctypes.c_void_p)))
    handles = (ctypes.c_void_p * len(devices))(*devices)
    start(endpoint.encode(), cache_dir.encode() if cache_dir else None, n_threads, len(devices), handles)


def add_server(endpoint: str, views: list[RemoteView]) -> list[str]:
    """Register the RPC server at endpoint (HOST:PORT, already probed) in this process's ggml registry: its
    devices (RPC0, RPC1, ... in the order added) are then devices the planner and llama.cpp place layers on,
    listed as `views` (one per device the server has, in its order) describes them. Returns their names;
    RpcBackendError when the server has another number of devices than views."""
    lib = ggml_library()
    add = _proc(lib, "ggml_backend_rpc_add_server", ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p))
    lib.ggml_backend_register.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_register.restype = None
    lib.ggml_backend_reg_dev_count.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_reg_dev_count.restype = ctypes.c_size_t
    lib.ggml_backend_reg_dev_get.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    lib.ggml_backend_reg_dev_get.restype = ctypes.c_void_p
    lib.ggml_backend_dev_name.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_dev_name.restype = ctypes.c_char_p
    before = {lib.ggml_backend_dev_get(i) for i in range(lib.ggml_backend_dev_count())}
    reg = add(endpoint.encode())
    if not reg:
        raise RpcBackendError(f"the RPC server at {endpoint} lends no device")
    devices = [lib.ggml_backend_reg_dev_get(reg, i) for i in range(lib.ggml_backend_reg_dev_count(reg))]
    if len(devices) != len(views):
        raise RpcBackendError(f"the RPC server at {endpoint} has {len(devices)} device(s), its facts {len(views)}")
    if not set(devices) <= before:  # added once per process (ggml keeps one registry entry per endpoint)
        lib.ggml_backend_register(reg)
    names = [lib.ggml_backend_dev_name(d).decode() for d in devices]
    REMOTE_DEVICES.update(zip(names, views))
    return names
