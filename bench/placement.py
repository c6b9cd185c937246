#!/usr/bin/env python3
"""Placement accuracy and speed: planned bytes per device against what llama.cpp allocates, and the decode
speed of the planner's placement against a sweep of manual --gpu-layers settings. Prints one JSON document.

Runs on whatever devices this process's llama.cpp sees. On a machine without a GPU, Mesa's lavapipe is a
real Vulkan device when named: GGML_VK_VISIBLE_DEVICES=0 python bench/placement.py

  --settings all,half,one,spill   which placements to load and measure (default: all four; cpu: none offloaded;
                                  experts: a MoE model's experts partly in host RAM, for --model a MoE GGUF)
  --sweep                         also time decoding for the planner's choice and for manual -ngl values
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

MIB = 1 << 20


def settings(table, device, name: str, ctx: int, parallel: int):
    """(PlanRequest, devices) for one named setting on the first GPU (cpu: none)."""
    from host_runtime.placement.planner import Device, PlanRequest

    base = PlanRequest(n_ctx_per_seq=ctx, n_parallel=parallel)
    if name == "cpu":
        return replace(base, cpu_only=True), []
    if device is None:
        raise SystemExit("no GPU device: set GGML_VK_VISIBLE_DEVICES=0 to use lavapipe, or run --settings cpu")
    if name == "all":
        return replace(base, n_gpu_layers=table.n_layer + 1), [device]
    if name == "half":
        return replace(base, n_gpu_layers=(table.n_layer + 1) // 2), [device]
    if name == "one":
        return replace(base, n_gpu_layers=1), [device]
    if name == "spill":
        # A card that holds the head and about half the layers with their KV: the rest, KV included, go to the
        # CPU. Its speed class is raised above the host's so the planner (not an explicit -ngl) fills it.
        per_layer = table.layer_weight_bytes(0) + table.kv_layer_bytes(0, ctx, parallel)
        room = table.output_weight_bytes() + per_layer * table.n_layer // 2 + 160 * MIB
        small = Device(device.name, device.description, room + 512 * MIB, room + 512 * MIB, 1000.0,
                       device.pci_address, device.backend)
        return base, [small]
    if name == "experts":
        # A mixture-of-experts model on a card that holds every layer's attention and the head, and the experts of
        # about half the layers: the planner (raised above the host, as in spill) keeps the rest in host RAM.
        if not table.is_moe:
            raise SystemExit("--settings experts: the model is not a mixture of experts")
        dense = sum(table.layer_weight_bytes(il, experts=False) + table.kv_layer_bytes(il, ctx, parallel)
                    for il in range(table.n_layer))
        half = sum(table.layer_expert_bytes(il) for il in range(table.n_layer // 2, table.n_layer))
        # Slack for the compute buffers, short of the other half of the experts (which must not fit).
        room = table.output_weight_bytes() + dense + half + table.layer_expert_bytes(0) // 4 + 24 * MIB
        card = Device(device.name, device.description, room + 512 * MIB, room + 512 * MIB, 1000.0,
                      device.pci_address, device.backend)
        return base, [card]
    raise SystemExit(f"unknown setting {name!r}")


def measure(model_path: str, names: list[str], ctx: int, parallel: int, n_batch: int) -> list[dict]:
    from host_runtime.gpu import llama_log
    from host_runtime.engine.model import ContextConfig, LoadedModel
    from host_runtime.placement.model_table import read_table
    from host_runtime.placement.proof import prove, tolerance
    from host_runtime.placement.session import live_devices

    llama_log.install()
    table = read_table(model_path)
    devices, host = live_devices()
    rows = []
    for name in names:
        request, devs = settings(table, devices[0] if devices else None, name, ctx, parallel)
        placement, runs = prove(model_path, table, devs, host, request, n_batch=n_batch, n_threads=2)
        config = ContextConfig(n_ctx_per_seq=ctx, n_parallel=parallel, n_batch=n_batch, n_threads=2)
        started = time.monotonic()
        model = LoadedModel(model_path, config, placement=placement, table=table)
        load_s = time.monotonic() - started
        devices_out = []
        for s in placement.shares:
            got = model.allocation.by_device.get(s.device, {})
            planned = {"weights": s.weights_bytes, "kv": s.kv_bytes, "compute": s.compute_bytes}
            total_got = sum(got.values())
            devices_out.append({
                "device": s.device, "layers": s.n_layers + (1 if s.holds_output else 0),
                "planned": planned, "allocated": got, "planned_total": s.used_bytes, "allocated_total": total_got,
                "ratio": round(total_got / s.used_bytes, 4) if s.used_bytes else None,
                "within_tolerance": abs(total_got - s.used_bytes) <= tolerance(s.used_bytes),
                "estimated_compute_before_proof": _estimate(table, s, request, placement),
            })
        rows.append({"setting": name, "n_gpu_layers": placement.n_gpu_layers, "tensor_split": placement.tensor_split,
                     "n_cpu_moe": placement.n_cpu_moe, "notes": list(placement.notes),
                     "n_ctx_per_seq": placement.n_ctx_per_seq, "n_parallel": placement.n_parallel,
                     "dry_runs": len(runs), "load_s": round(load_s, 2), "devices": devices_out})
        del model
        gc.collect()
    return rows


def _estimate(table, share, request, placement) -> int:
    from host_runtime.placement.planner import compute_estimate

    return compute_estimate(table, request.n_ubatch, placement.n_ctx_per_seq, share.holds_output, share.device != "CPU")


def decode_rate(model_path: str, n_gpu_layers: int | None, tokens: int, cpu: bool = False) -> float:
    """Greedy decode tok/s of one sequence after a short prompt, through the engine's own model loader."""
    import llama_cpp

    from host_runtime.engine.model import ContextConfig, LoadedModel

    config = ContextConfig(n_ctx_per_seq=512, n_parallel=1, n_batch=64, n_threads=2, n_gpu_layers=n_gpu_layers,
                           placement="cpu" if cpu else "auto")
    model = LoadedModel(model_path, config)
    prompt = model.tokenize("The history of computing began", add_bos=True, special=False)
    batch = llama_cpp.llama_batch_init(64, 0, 1)
    try:
        def step(tokens_, pos):
            batch.n_tokens = len(tokens_)
            for i, t in enumerate(tokens_):
                batch.token[i], batch.pos[i], batch.n_seq_id[i] = t, pos + i, 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = i == len(tokens_) - 1
            assert llama_cpp.llama_decode(model.ctx.ctx, batch) == 0
            logits = llama_cpp.llama_get_logits_ith(model.ctx.ctx, len(tokens_) - 1)
            return max(range(model.n_vocab), key=lambda j: logits[j])
        nxt = step(prompt, 0)
        pos = len(prompt)
        started = time.monotonic()
        for _ in range(tokens):
            nxt = step([nxt], pos)
            pos += 1
        return tokens / (time.monotonic() - started)
    finally:  # the model goes with this frame
        llama_cpp.llama_batch_free(batch)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="GGUF (default: the embedded SmolLM2-135M-Instruct)")
    ap.add_argument("--settings", default="all,half,one,spill")
    ap.add_argument("--ctx-size", type=int, default=8192)
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--sweep", action="store_true", help="time decoding: the planner's choice against manual -ngl")
    ap.add_argument("--tokens", type=int, default=32)
    args = ap.parse_args()
    from host_runtime.engine.model import default_model_path
    from host_runtime.gpu.llama_devices import compiled_backends, list_devices

    model_path = str(args.model or default_model_path())
    doc = {"model": Path(model_path).name, "backends": compiled_backends(),
           "devices": [d.to_json() for d in list_devices()],
           "GGML_VK_VISIBLE_DEVICES": os.environ.get("GGML_VK_VISIBLE_DEVICES"),
           "tolerance": "max(3%, 64 MiB) per device",
           "settings": measure(model_path, args.settings.split(","), args.ctx_size, args.parallel, args.batch)}
    if args.sweep:
        from host_runtime.placement.model_table import read_table

        n_all = read_table(model_path).n_layer + 1
        planner = decode_rate(model_path, None, args.tokens)
        manual = {str(n): round(decode_rate(model_path, n, args.tokens), 2)
                  for n in sorted({0, 1, n_all // 4, n_all // 2, 3 * n_all // 4, n_all})}
        best = max(manual.values())
        doc["decode"] = {"planner_tok_s": round(planner, 2), "manual_tok_s_by_gpu_layers": manual,
                         "best_manual_tok_s": best, "planner_over_best_manual": round(planner / best, 3),
                         "cpu_tok_s": round(decode_rate(model_path, None, args.tokens, cpu=True), 2)}
    print(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
