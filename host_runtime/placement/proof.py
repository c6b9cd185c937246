"""Proof before load: ask llama.cpp what a placement allocates, without allocating it.

llama.cpp loads the model and builds the context with `no_alloc` (only metadata is read, every buffer is
sized but none is made) and logs the compute buffer each device would get. Weights and KV are the planner's
own sums over the tensor table, which equal llama.cpp's buffers (tests/test_placement_llama.py checks them
against real loads); compute buffers depend on llama.cpp's graph, so the dry run's figures replace the
planner's estimate, and the plan is made again with them until it no longer changes.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, replace

from host_runtime.common.errors import EveryCycleError
from host_runtime.gpu import llama_log
from host_runtime.placement.llama_params import attention_for, context_params, model_params
from host_runtime.placement.model_table import ModelTable
from host_runtime.placement.planner import Device, Host, Placement, PlacementError, PlanRequest, plan

log = logging.getLogger(__name__)

_BUFFER_LINE = re.compile(r"(\S+)\s+(model|KV|RS|compute|output) buffer size =\s+([\d.]+) MiB")
KINDS = {"model": "weights", "KV": "kv", "RS": "kv", "compute": "compute", "output": "compute"}
MAX_ROUNDS = 3


def tolerance(planned: int) -> int:
    """How far llama.cpp's figure may stray from the plan before it counts as wrong: 3% or 64 MiB."""
    return max(planned * 3 // 100, 64 << 20)


class ProofFailed(EveryCycleError):
    """llama.cpp refused the placement in its dry run (the message says why)."""


@dataclass(frozen=True)
class Allocation:
    """Bytes by device name ("CPU" for host buffers) and kind (weights, kv, compute), as llama.cpp reported."""

    by_device: dict[str, dict[str, int]]

    def get(self, device: str, kind: str) -> int:
        return self.by_device.get(device, {}).get(kind, 0)


def parse_buffer_log(text: str, gpu_names: set[str]) -> Allocation:
    """llama.cpp's `<buffer> model|KV|compute|output buffer size = N MiB` lines, summed per device.

    A buffer named after a GPU ("Vulkan0", "CUDA1") is that GPU's; every other (CPU, CPU_Mapped,
    CPU_REPACK, Vulkan_Host, CUDA_Host) lives in host RAM."""
    out: dict[str, dict[str, int]] = {}
    for name, kind, mib in _BUFFER_LINE.findall(text):
        device = name if name in gpu_names else "CPU"
        bucket = out.setdefault(device, {})
        bucket[KINDS[kind]] = bucket.get(KINDS[kind], 0) + round(float(mib) * (1 << 20))
    return Allocation(out)


def dry_run(model_path: str, placement: Placement, *, n_batch: int, n_threads: int, batch_invariant: bool,
            speculation: bool = False) -> Allocation:
    """llama.cpp sizes every buffer of this placement without allocating one; its compute figures come back."""
    import llama_cpp

    mp = model_params(placement, no_alloc=True)
    cparams = context_params(n_ctx_per_seq=placement.n_ctx_per_seq, n_parallel=placement.n_parallel,
                             n_batch=n_batch, n_threads=n_threads, batch_invariant=batch_invariant,
                             attention=attention_for(placement, batch_invariant, speculation))
    with llama_log.capture() as text:
        model = llama_cpp.llama_model_load_from_file(model_path.encode(), mp.params)
        if not model:
            raise ProofFailed(f"llama.cpp could not size {model_path} for this placement: {_last_error(text)}")
        try:
            ctx = llama_cpp.llama_init_from_model(model, cparams)
            if not ctx:
                raise ProofFailed(f"llama.cpp could not size a context of {placement.n_ctx_per_seq} x "
                                  f"{placement.n_parallel} for this placement: {_last_error(text)}")
            llama_cpp.llama_free(ctx)
        finally:
            llama_cpp.llama_model_free(model)
    return parse_buffer_log("".join(text), set(placement.device_order))


def _last_error(pieces: list[str]) -> str:
    lines = [line.strip() for line in "".join(pieces).splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower() or "failed" in line.lower()]
    return (errors or lines or ["no message"])[-1]


def _layout(p: Placement) -> tuple:
    return (tuple((s.device, s.first_layer, s.last_layer, s.holds_output) for s in p.shares), p.n_ctx_per_seq,
            p.n_parallel, p.n_cpu_moe)


def prove(model_path: str, table: ModelTable, devices: list[Device], host: Host, request: PlanRequest, *,
          n_batch: int, n_threads: int = 0, batch_invariant: bool = True,
          speculation: bool = False) -> tuple[Placement, list[Allocation]]:
    """Plan, ask llama.cpp for the compute buffers of that plan, plan again with them; repeat until the layout
    holds (at most MAX_ROUNDS). Raises PlacementError where the proven figures do not fit."""
    request = replace(request, n_ubatch=n_batch)
    placement = plan(table, devices, host, request)
    runs: list[Allocation] = []
    for _ in range(MAX_ROUNDS):
        allocation = dry_run(model_path, placement, n_batch=n_batch, n_threads=n_threads,
                             batch_invariant=batch_invariant, speculation=speculation)
        runs.append(allocation)
        measured = {s.device: allocation.get(s.device, "compute") for s in placement.shares}
        again = plan(table, devices, host, replace(request, measured_compute=measured))
        if _layout(again) == _layout(placement):
            return again, runs
        log.info("placement: llama.cpp's compute buffers moved the plan (%s -> %s); checking again",
                 placement.summary(), again.summary())
        placement = again
    raise PlacementError(f"the placement did not settle after {MAX_ROUNDS} dry runs with llama.cpp: "
                         f"last {placement.summary()}")
