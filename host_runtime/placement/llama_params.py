"""A Placement and the engine's settings as llama.cpp's model and context parameters (one place for both the
dry run and the real load, so the proof checks exactly what is then loaded)."""

from __future__ import annotations

import ctypes
import functools
import os
from dataclasses import dataclass

from host_runtime.gpu.llama_devices import cpu_buffer_type, device_handles, list_devices
from host_runtime.placement.kv_types import DEFAULT_KV, kv_type, needs_flash_attention, per_row_attention
from host_runtime.placement.planner import Placement


class _BufferTypeOverride(ctypes.Structure):
    """llama.h's llama_model_tensor_buft_override (llama-cpp-python types the params' field as void*)."""

    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


class DeviceMissing(Exception):
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


def call_tokens(n_batch: int, n_parallel: int, batch_invariant: bool) -> int:
    """The most tokens one decode call carries (engine/step_plan.py): invariant, a decode token per sequence or
    prompt chunks within the n_batch budget; otherwise both in one call."""
    return max(n_batch, n_parallel) if batch_invariant else n_batch + n_parallel


def exact_rows(placement: Placement, batch_invariant: bool, speculation: bool) -> bool:
    """Whether the context lays attention out so that several query rows of one sequence (a draft verified in
    one call) compute exactly as one row does (context_params): in the invariant mode with speculation, where
    every layer runs on the CPU. (GPU kernels are not measured for this; there the layout stays as it was.)"""
    return batch_invariant and speculation and placement.n_gpu_layers == 0


def context_params(*, n_ctx_per_seq: int, n_parallel: int, n_batch: int, n_threads: int, batch_invariant: bool,
                   n_threads_decode: int = 0, exact_rows: bool = False, kv_types: tuple[str, str] = DEFAULT_KV):
    """The generation context: a KV stream per sequence (batch_invariant) or one shared buffer, calls of up to
    call_tokens() tokens (see engine/model.py); n_threads for calls of several tokens, n_threads_decode
    (default: the same) for calls of one; the KV cache in kv_types (K, V)."""
    import llama_cpp

    cparams = llama_cpp.llama_context_default_params()
    cparams.n_ctx = n_ctx_per_seq * n_parallel
    cparams.n_batch = cparams.n_ubatch = call_tokens(n_batch, n_parallel, batch_invariant)
    cparams.n_seq_max = n_parallel
    cparams.n_threads_batch = n_threads or os.cpu_count() or 1
    # One-token calls on every thread too. An earlier split (one fewer for them) answered a slowdown at c=1 in
    # the server whose cause was libgomp throttling its barrier spinning after the warm-up decoded on another
    # thread than the loop (Engine.start). Fixed, on 2 cores: one-token calls 15.1 ms in the server on two
    # threads against 22.8 on one; chat at c=1 0.97x llama-server's tok/s against 0.65x.
    cparams.n_threads = n_threads_decode or cparams.n_threads_batch
    cparams.kv_unified = not batch_invariant
    cparams.no_perf = True
    # Not invariant: one unified buffer, so that a call may mix sequences with different token counts (with a
    # stream per sequence llama.cpp splits such a call into equal-count pieces, one weight pass each).
    # Invariant: no flash attention. llama.cpp's CPU kernel takes other paths by the call's shape: a tiled one
    # from ~64 query tokens, and, for one query token of a call's only sequence once 512 or more KV cells are
    # in view, a split over the KV cells whose partial sums add up in another order (ops.cpp,
    # use_split_kv_path). Measured on a 355-token prompt: that token's logits differed by up to 0.53 from the
    # same position verified as one of five tokens, and a greedy output changed 13 tokens later. Plain
    # attention (matrix products and a softmax per row) gave identical logits for 1 to 12 query tokens at
    # 355 and 900 cells, and cost 7.3 ms against 6.6 ms a token at 355 cells and less for multi-token calls.
    cparams.flash_attn_type = (llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED if batch_invariant
                               else llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO)
    k, v = kv_type(kv_types[0]), kv_type(kv_types[1])
    cparams.type_k, cparams.type_v = k.ggml_type, v.ggml_type
    if needs_flash_attention(kv_types):
        # A quantized V needs it; with a quantized K it is also the per-row path below, in every mode.
        cparams.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
    if exact_rows:
        # Verifying a draft puts several query rows of one sequence in a call, and plain attention computes
        # those otherwise than one row: its F16 matrix products go to llamafile's tinyBLAS from two rows and to
        # ggml's vec_dot for one (measured: logits 0.47 to 1.1 apart at 408 cells, so a verified token could
        # differ from plain decoding's). Flash attention takes its per-row reference path in every shape unless
        # K and V are the same F16 or F32 type (the split over KV cells and the tiles need that): bit-identical
        # logits for 1 to 16 rows at 156 to 786 cells, and alone or batched. Where they are, V in BF16 keeps
        # F16's size; measured on 2 cores: decode as fast, a 7-token verify 20% and prefill 13% slower.
        cparams.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
        if not per_row_attention(kv_types):
            cparams.type_v = kv_type("bf16").ggml_type
    return cparams
