"""The GPUs as llama.cpp sees them: ggml's device registry through ctypes (names, PCI ids, free memory).

This is the one place that asks the installed llama.cpp build which backends it has and which devices they
drive; discovery writes it into the topology file and the planner reads it from there (or live).
Mesa's lavapipe (a Vulkan device that runs on the CPU) is listed by ggml only when GGML_VK_VISIBLE_DEVICES
names it: a CPU-emulated GPU is never offloaded to on its own, but the tests use it as a real Vulkan device.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import asdict, dataclass, replace

from host_runtime.common.errors import UnavailableError
from host_runtime.gpu.bandwidth import bandwidth_gbps
from host_runtime.gpu.llama_build import lib_dir, select

DEVICE_TYPES = {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel", 4: "meta"}


@dataclass(frozen=True)
class RemoteView:
    """An RPC device as its member describes it (host_runtime/shard): ggml's own says only the endpoint (a
    tunnel's loopback end) and, for a lent CPU, all of the member's RAM as free."""
    description: str        # the member's address and its device: "10.0.0.3:50052 CPU"
    type: str               # the member's device's kind: cpu, gpu, igpu
    free_bytes: int         # what the member lends
    total_bytes: int
    bandwidth_gbps: float   # the member's device's memory bandwidth: its speed class, as a local card's


# RPC devices by ggml name (RPC0, ...), filled by rpc_devices.add_server.
REMOTE_DEVICES: dict[str, RemoteView] = {}


class LlamaDevicesError(UnavailableError):
    """llama.cpp's library could not be loaded or asked."""


@dataclass(frozen=True)
class LlamaDevice:
    index: int                # position in ggml's registry
    name: str                 # "CUDA0", "Vulkan0": what llama.cpp's logs and buffers are named after
    description: str          # the card's name as the backend reports it
    backend: str              # "CUDA", "Vulkan", "CPU", "BLAS" ...
    type: str                 # cpu, gpu, igpu, accel
    free_bytes: int
    total_bytes: int
    pci_address: str | None   # lower-case domain:bus:device.function where the backend knows it
    bandwidth_gbps: float

    def to_json(self) -> dict:
        return asdict(self)


class _Caps(ctypes.Structure):
    _fields_ = [("async_", ctypes.c_bool), ("host_buffer", ctypes.c_bool), ("buffer_from_host_ptr", ctypes.c_bool),
                ("events", ctypes.c_bool), ("mmap_support", ctypes.c_bool)]


class _Props(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("description", ctypes.c_char_p), ("memory_free", ctypes.c_size_t),
                ("memory_total", ctypes.c_size_t), ("type", ctypes.c_int), ("device_id", ctypes.c_char_p),
                ("caps", _Caps)]


def ggml_library():
    """libggml as libllama loaded it, with the registry's functions typed."""
    select()
    try:
        import llama_cpp  # noqa: F401  (loads libllama and, with it, libggml)
        # The very libggml that libllama loaded: from its folder (llama_cpp._ggml always takes the wheel's,
        # which with the CUDA build chosen is a second registry that knows no CUDA device) and by its
        # SONAME file (a wheel holds libggml.so as a separate copy, which would load twice).
        d = lib_dir()
        lib = ctypes.CDLL(str(d / "libggml.so.0" if (d / "libggml.so.0").exists() else d / "libggml.so"))
    except (ImportError, OSError) as exc:
        raise LlamaDevicesError(f"llama.cpp cannot be loaded: {exc}") from None
    lib.ggml_backend_dev_count.restype = ctypes.c_size_t
    lib.ggml_backend_dev_get.restype = ctypes.c_void_p
    lib.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
    lib.ggml_backend_dev_get_props.argtypes = [ctypes.c_void_p, ctypes.POINTER(_Props)]
    lib.ggml_backend_dev_get_props.restype = None
    lib.ggml_backend_dev_backend_reg.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_dev_backend_reg.restype = ctypes.c_void_p
    lib.ggml_backend_reg_name.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_reg_name.restype = ctypes.c_char_p
    lib.ggml_backend_reg_count.restype = ctypes.c_size_t
    lib.ggml_backend_reg_get.argtypes = [ctypes.c_size_t]
    lib.ggml_backend_reg_get.restype = ctypes.c_void_p
    return lib


def device_handles() -> list[int]:
    """ggml_backend_dev_t pointers in registry order (for llama_model_params.devices)."""
    lib = ggml_library()
    return [lib.ggml_backend_dev_get(i) for i in range(lib.ggml_backend_dev_count())]


def cpu_buffer_type() -> int:
    """The CPU device's buffer type (ggml_backend_buffer_type_t): where a tensor buffer-type override keeps a
    tensor in host RAM, as llama-server's --cpu-moe does with ggml_backend_cpu_buffer_type()."""
    lib = ggml_library()
    lib.ggml_backend_dev_by_type.argtypes = [ctypes.c_int]
    lib.ggml_backend_dev_by_type.restype = ctypes.c_void_p
    lib.ggml_backend_dev_buffer_type.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_dev_buffer_type.restype = ctypes.c_void_p
    dev = lib.ggml_backend_dev_by_type(0)  # GGML_BACKEND_DEVICE_TYPE_CPU
    if not dev:
        raise LlamaDevicesError("llama.cpp's build has no CPU device")
    return lib.ggml_backend_dev_buffer_type(dev)


def compiled_backends() -> list[str]:
    """The backends this llama.cpp build registered ("CPU", "Vulkan", "CUDA"), devices or not."""
    lib = ggml_library()
    return [lib.ggml_backend_reg_name(lib.ggml_backend_reg_get(i)).decode()
            for i in range(lib.ggml_backend_reg_count())]


def list_devices(include_cpu: bool = False) -> list[LlamaDevice]:
    """Every device ggml registered, GPUs first as ggml orders them; the CPU device only when asked."""
    lib = ggml_library()
    out = []
    for i in range(lib.ggml_backend_dev_count()):
        dev = lib.ggml_backend_dev_get(i)
        props = _Props()
        lib.ggml_backend_dev_get_props(dev, ctypes.byref(props))
        kind = DEVICE_TYPES.get(props.type, str(props.type))
        if kind in ("cpu", "accel", "meta") and not include_cpu:
            continue
        backend = lib.ggml_backend_reg_name(lib.ggml_backend_dev_backend_reg(dev)).decode()
        name = (props.name or b"").decode()
        desc = (props.description or b"").decode(errors="replace")
        device = LlamaDevice(index=i, name=name, description=desc, backend=backend, type=kind,
                             free_bytes=int(props.memory_free), total_bytes=int(props.memory_total),
                             pci_address=props.device_id.decode() if props.device_id else None,
                             bandwidth_gbps=bandwidth_gbps(desc, kind))
        remote = REMOTE_DEVICES.get(name) if backend == "RPC" else None
        if remote is not None:
            device = replace(device, description=remote.description, free_bytes=remote.free_bytes,
                             total_bytes=remote.total_bytes, bandwidth_gbps=remote.bandwidth_gbps)
        out.append(device)
    return out


def vulkan_visibility_note() -> str | None:
    """Why a Vulkan device might be missing from the list, for status lines."""
    if "GGML_VK_VISIBLE_DEVICES" in os.environ:
        return f"GGML_VK_VISIBLE_DEVICES={os.environ['GGML_VK_VISIBLE_DEVICES']}"
    return None
