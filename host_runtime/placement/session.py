"""Where a plan's inputs come from: the live devices and RAM (proven with llama.cpp), or a topology file."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from pathlib import Path

from host_runtime.common.errors import InputError
from host_runtime.common.readings import is_unavailable
from host_runtime.gpu import llama_log
from host_runtime.gpu.bandwidth import bandwidth_gbps
from host_runtime.gpu.llama_devices import list_devices
from host_runtime.placement.model_table import ModelTableError, read_table
from host_runtime.placement.planner import Device, Host, Placement, PlacementError, plan
from host_runtime.placement.proof import ProofFailed, prove
from host_runtime.placement.whisper_file import read_shape, resident_bytes


class PlanInputsError(InputError):
    """The topology file or the model cannot be read."""


@dataclass(frozen=True)
class Outcome:
    placement: Placement | None
    error: str | None
    proven: bool
    proof_note: str


def only_main_gpu(devices: list[Device], main_gpu: int | None) -> list[Device]:
    """--main-gpu I: the planner sees that card alone, so the whole offloaded part goes there."""
    if main_gpu is None:
        return devices
    if main_gpu >= len(devices):
        raise PlacementError(f"--main-gpu {main_gpu}: there are {len(devices)} GPU(s), numbered from 0")
    return [devices[main_gpu]]


def devices_from_topology(doc: dict) -> tuple[list[Device], Host]:
    """The GPUs llama.cpp saw and the RAM available when discovery wrote the file."""
    listed = doc.get("gpus", {}).get("llama_devices", [])
    if is_unavailable(listed):
        listed = []
    devices = [Device(d["name"], d["description"], int(d["free_bytes"]), int(d["total_bytes"]),
                      float(d.get("bandwidth_gbps") or bandwidth_gbps(d["description"], d.get("type", "gpu"))),
                      d.get("pci_address"), d.get("backend", ""))
               for d in listed if d.get("type") in ("gpu", "igpu")]
    memory = doc.get("memory", {})
    return devices, Host(int(memory["available_bytes"]), int(memory["total_bytes"]))


def live_devices() -> tuple[list[Device], Host]:
    import psutil

    vm = psutil.virtual_memory()
    return ([Device(d.name, d.description, d.free_bytes, d.total_bytes, d.bandwidth_gbps, d.pci_address, d.backend)
             for d in list_devices()], Host(vm.available, vm.total))


def plan_for_cli(model_path: str, context, *, n_batch: int, topology: str | None) -> Outcome:
    """`everycycle plan`: context is the engine's settings (engine.model.ContextConfig), n_batch llama.cpp's."""
    try:
        table = read_table(model_path)
    except ModelTableError as exc:
        raise PlanInputsError(f"--model: {exc}") from None
    request = context.plan_request(n_ubatch=n_batch)
    main_gpu = context.main_gpu
    if topology:
        try:
            doc = json.loads(Path(topology).read_text())
            devices, host = devices_from_topology(doc)
            host = replace(host, budget_bytes=context.host_ram_bytes)
        except OSError as exc:
            raise PlanInputsError(f"--topology: cannot read {topology}: {exc.strerror or exc}") from None
        except (ValueError, KeyError, TypeError) as exc:
            raise PlanInputsError(f"--topology: {topology} is not a topology file ({exc})") from None
        try:
            return Outcome(plan(table, only_main_gpu(devices, main_gpu), host, request), None, False,
                           f"planned from {topology}; compute buffers estimated (llama.cpp proves only live devices)")
        except PlacementError as exc:
            return Outcome(None, str(exc), False, "")

    llama_log.install()
    devices, host = live_devices()
    host = replace(host, budget_bytes=context.host_ram_bytes)
    try:
        placement_, runs = prove(model_path, table, only_main_gpu(devices, main_gpu), host, request, n_batch=n_batch)
    except (PlacementError, ProofFailed) as exc:
        return Outcome(None, str(exc), True, "")
    return Outcome(placement_, None, True, f"compute buffers from {len(runs)} llama.cpp dry run(s) (no_alloc)")


def resident_bytes_for(model_path: str, context) -> int:
    """What a model holds once loaded, by the planner's accounting with all of it on the CPU: the weights from its
    tensor table, the KV cache of the sequences these settings give it, and the compute buffers (estimated). The
    engine pool counts models against its memory budget with it. context: the engine's settings
    (engine.model.ContextConfig). A Whisper model (whisper.cpp's file): its weights, KV and compute buffers as
    whisper.cpp allocates them (whisper_file.py). Raises ModelTableError for an unreadable file."""
    whisper = read_shape(model_path)
    if whisper is not None:
        return resident_bytes(whisper, os.path.getsize(model_path))
    table = read_table(model_path)
    unlimited = Host(1 << 62, 1 << 62)  # the figure, not a fit: the pool decides what fits its budget
    request = replace(context.plan_request(), cpu_only=True, n_gpu_layers=None, tensor_split=None)
    placement_ = plan(table, [], unlimited, request)
    return sum(s.used_bytes for s in placement_.shares)
