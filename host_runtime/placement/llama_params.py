"""A Placement and the engine's settings as llama.cpp's model and context parameters (one place for both the
dry run and the real load, so the proof checks exactly what is then loaded)."""

from __future__ import annotations

import ctypes
import functools
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from host_runtime.common.errors import UnavailableError
from host_runtime.discovery.cpu import cpuinfo_flags
from host_runtime.gpu.llama_devices import cpu_buffer_type, device_handles, list_devices
from host_runtime.gpu.rpc_devices import is_remote
from host_runtime.placement.kv_types import DEFAULT_KV, AttentionLayout, attention_layout, kv_type
from host_runtime.placement.planner import Placement


class _BufferTypeOverride(ctypes.Structure):
    """llama.h's llama_model_tensor_buft_override (llama-cpp-python types the params' field as void*)."""

    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


class DeviceMissing(UnavailableError):
    """The placement names a device this process's llama.cpp does not have."""


@dataclass
class ModelParams:
    params: object          # llama_cpp.llama_model_params
    keep: tuple = ()        # ctypes arrays the params point into: alive as long as the params are used


@functools.cache
def extra_buffers_safe() -> bool:
    """Whether llama.cpp may repack weights into its extra CPU buffer types. Not where its CPU backend was
    built with AMX (a native build on a Sapphire Rapids or newer Xeon): the AMX buffer's matrix multiply
    segfaults in the first batched llama_decode (seen here on this llama.cpp; llama.cpp issue #20824, open),
    so weights stay in plain CPU buffers there: slower on that CPU than AMX, but serving."""
    import llama_cpp

    return b"AMX_INT8 = 1" not in llama_cpp.llama_print_system_info()


# The record of the CMake arguments the image's llama.cpp was built with (image/mkosi.postinst.chroot writes it
# beside the venv); `make run`'s build, for the machine it runs on, has none.
BUILD_RECORD = "llama-cmake-args"


def native_build(cmake_args: str | None) -> bool:
    """Whether llama.cpp was compiled for this very CPU (-march=native): no record, or one without
    GGML_NATIVE=OFF."""
    return cmake_args is None or re.search(r"-DGGML_NATIVE=(OFF|0|FALSE|NO)\b", cmake_args, re.IGNORECASE) is None


def build_record(prefix: Path | None = None) -> str | None:
    """The CMake arguments the installed llama.cpp was built with (the image's record beside the venv), or None
    where there is none (`make run`'s native build)."""
    try:
        return ((prefix or Path(sys.prefix)) / BUILD_RECORD).read_text()
    except OSError:
        return None


@functools.cache
def f16_wide_vectors() -> bool:
    """Whether ggml's F16 vector arithmetic is AVX512-FP16's, 128 values a step (kv_types.attention_layout: a
    shorter row goes a value at a time): a native build on a CPU with avx512_fp16."""
    cmake_args = build_record()
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return native_build(cmake_args) and "avx512_fp16" in cpuinfo_flags(cpuinfo)


def model_params(placement: Placement, *, no_alloc: bool = False) -> ModelParams:
    import llama_cpp

    mparams = llama_cpp.llama_model_default_params()
    mparams.n_gpu_layers = placement.n_gpu_layers
    mparams.split_mode = llama_cpp.LLAMA_SPLIT_MODE_LAYER
    mparams.use_extra_bufts = extra_buffers_safe()
    # The device list llama.cpp offloads to, in the plan's order; empty (just the terminator) keeps every
    # tensor and every operation on the CPU, even in a build with GPU backends.
    handles = {d.name: d for d in list_devices()}
    registry = device_handles()
    wanted = []
    for name in placement.device_order:
        if name not in handles:
            raise DeviceMissing(f"the placement names {name}, which this llama.cpp build does not see "
                                f"(it has: {', '.join(handles) or 'no GPU'})")
        wanted.append(registry[handles[name].index])
    devices = (ctypes.c_void_p * (len(wanted) + 1))(*wanted, None)
    mparams.devices = ctypes.cast(devices, ctypes.c_void_p)  # llama-cpp-python types the field as void*
    keep: tuple = (devices,)
    if placement.device_order:
        split = (ctypes.c_float * llama_cpp.llama_max_devices())(*placement.tensor_split)
        mparams.tensor_split = split
        keep += (split,)
    if placement.experts_pattern:
        # The routed experts of layers [0, n_cpu_moe) in host RAM; NULL-terminated, as llama.cpp reads the list.
        pattern = placement.experts_pattern.encode()
        overrides = (_BufferTypeOverride * 2)(_BufferTypeOverride(pattern, cpu_buffer_type()),
                                               _BufferTypeOverride(None, None))
        mparams.tensor_buft_overrides = ctypes.cast(overrides, ctypes.c_void_p)
        keep += (overrides, pattern)
    if no_alloc:
        mparams.no_alloc = True
        mparams.load_mode = 0  # LLAMA_LOAD_MODE_NONE: no mmap, nothing read but metadata
    return ModelParams(mparams, keep)


def call_tokens(n_batch: int, n_parallel: int) -> int:
    """The most tokens one decode call carries (engine/step_plan.py): a decode token per sequence and prompt chunks
    within the n_batch budget, in one call (the mixed mode, and the invariant mode where a row computes alike in
    any call: step_plan's shape_blind)."""
    return n_batch + n_parallel


def attention_for(placement: Placement, batch_invariant: bool, speculation: bool = False) -> AttentionLayout:
    """The attention this placement runs with (kv_types.attention_layout)."""
    return attention_layout(placement.kv_types, batch_invariant=batch_invariant,
                            cpu_only=placement.n_gpu_layers == 0, speculation=speculation,
                            n_ctx_per_seq=placement.n_ctx_per_seq, n_parallel=placement.n_parallel,
                            remote=any(is_remote(name) for name in placement.device_order),
                            f16_wide_vectors=f16_wide_vectors())


def context_params(*, n_ctx_per_seq: int, n_parallel: int, n_batch: int, n_threads: int, batch_invariant: bool,
                   attention: AttentionLayout | None = None, n_threads_decode: int = 0):
    """The generation context: a KV stream per sequence (batch_invariant) or one shared buffer, calls of up to
    call_tokens() tokens (see engine/model.py); n_threads for calls of several tokens, n_threads_decode
    (default: the same) for calls of one; attention and the KV cache's stored types as `attention` says
    (kv_types.attention_layout: the rule, and why; None: the default types' with every layer on the CPU)."""
    import llama_cpp

    if attention is None:
        attention = attention_layout(DEFAULT_KV, batch_invariant=batch_invariant, cpu_only=True,
                                     n_ctx_per_seq=n_ctx_per_seq, n_parallel=n_parallel,
                                     f16_wide_vectors=f16_wide_vectors())

    cparams = llama_cpp.llama_context_default_params()
    cparams.n_ctx = n_ctx_per_seq * n_parallel
    cparams.n_batch = cparams.n_ubatch = call_tokens(n_batch, n_parallel)
    cparams.n_seq_max = n_parallel
    cparams.n_threads_batch = n_threads or os.cpu_count() or 1
    # One-token calls on every thread too. An earlier split (one fewer for them) answered a slowdown at c=1 in
    # the server whose cause was libgomp throttling its barrier spinning after the warm-up decoded on another
    # thread than the loop (Engine.start). Fixed, on 2 cores: one-token calls 15.1 ms in the server on two
    # threads against 22.8 on one; chat at c=1 0.97x llama-server's tok/s against 0.65x.
    cparams.n_threads = n_threads_decode or cparams.n_threads_batch
    # Not invariant: one unified buffer, so that a call may mix sequences with different token counts (with a
    # stream per sequence llama.cpp splits such a call into equal-count pieces, one weight pass each).
    cparams.kv_unified = not batch_invariant
    cparams.no_perf = True
    cparams.flash_attn_type = {"on": llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED,
                               "off": llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED,
                               "auto": llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO}[attention.flash]
    cparams.type_k, cparams.type_v = kv_type(attention.type_k).ggml_type, kv_type(attention.type_v).ggml_type
    return cparams
