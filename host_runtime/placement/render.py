"""A placement as the table `everycycle plan` prints (pure)."""

from __future__ import annotations

from host_runtime.placement.kv_types import AttentionLayout
from host_runtime.placement.matmul_rows import RowBounds
from host_runtime.placement.planner import Placement

MIB = 1 << 20


def _mib(n: int) -> str:
    return f"{n / MIB:,.0f}"


def render_table(p: Placement, *, proven: bool, proof_note: str = "") -> str:
    head = ("device", "layers", "weights", "KV", "compute", "used", "free", "margin", "left")
    rows = [head]
    for s in p.shares:
        layers = f"{s.first_layer}-{s.last_layer - 1}" if s.n_layers else "-"
        if s.holds_output:
            layers += " +out"
        name = s.device if s.device == "CPU" else f"{s.device} ({s.description})"
        rows.append((name, layers, _mib(s.weights_bytes), _mib(s.kv_bytes),
                     _mib(s.compute_bytes) + ("" if s.compute_measured else "~"), _mib(s.used_bytes),
                     _mib(s.free_bytes), _mib(s.margin_bytes), _mib(s.left_bytes)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = [f"{p.model}: {p.n_layer} layers, context {p.n_ctx_per_seq} tokens x {p.n_parallel} sequences "
             f"(queue {p.max_waiting}); sizes in MiB"]
    for i, r in enumerate(rows):
        lines.append("  ".join(c.ljust(widths[j]) if j < 2 else c.rjust(widths[j]) for j, c in enumerate(r)))
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    split = ",".join(f"{x:g}" for x in p.tensor_split) or "-"
    lines.append(f"llama.cpp: n_gpu_layers={p.n_gpu_layers} devices={','.join(p.device_order) or 'none (CPU)'} "
                 f"tensor_split={split} cache_type_k={p.kv_types[0]} cache_type_v={p.kv_types[1]} "
                 f"(KV {p.kv_bytes_per_token:,} bytes a token)")
    if p.experts_pattern:
        cpu = p.cpu_share
        lines.append(f"experts: layers 0-{p.n_cpu_moe - 1} keep their expert weights in host RAM "
                     f"({_mib(cpu.expert_bytes)} MiB on the CPU; llama.cpp: --n-cpu-moe {p.n_cpu_moe}, override "
                     f"{p.experts_pattern if len(p.experts_pattern) < 60 else p.experts_pattern[:40] + '...'}=CPU)")
    lines.append(("proven: " if proven else "not proven: ") + (proof_note or "")
                 + ("" if all(s.compute_measured for s in p.shares) else "; ~ marks an estimate"))
    lines += [f"note: {n}" for n in p.notes]
    return "\n".join(lines)


def backend_choice(p: Placement, compiled: list[str], seen: list[str], forced_cpu: bool,
                   build_note: str = "") -> tuple[str, str, str]:
    """(backend, device, reason) for the log, /metrics and status: what serves the tokens, and why. build_note:
    why this process loaded the llama.cpp build it did (host_runtime/gpu/llama_build.py), told where the tokens
    are not served by CUDA, so an NVIDIA card serving through Vulkan or not at all says why."""
    backend, device, reason = _backend_choice(p, compiled, seen, forced_cpu)
    if build_note and backend != "cuda":
        reason += f"; not CUDA: {build_note}"
    return backend, device, reason


def _backend_choice(p: Placement, compiled: list[str], seen: list[str], forced_cpu: bool) -> tuple[str, str, str]:
    if p.gpu_shares:
        backends = sorted({s.device.rstrip("0123456789") for s in p.gpu_shares})
        devices = ", ".join(f"{s.device} ({s.description})" for s in p.gpu_shares)
        return "+".join(backends).lower(), devices, f"{p.n_gpu_layers} of {p.n_layer + 1} layers offloaded"
    if forced_cpu:
        return "cpu", "CPU", "--placement cpu"
    gpu_backends = [b for b in compiled if b not in ("CPU", "BLAS", "RPC")]
    if not gpu_backends:
        return "cpu", "CPU", "this llama.cpp build has no GPU backend (built with: " + ", ".join(compiled) + ")"
    if not seen:
        return "cpu", "CPU", f"no GPU found by the {'/'.join(gpu_backends)} backend"
    return "cpu", "CPU", "no GPU was used: " + "; ".join(p.notes)


def prometheus_lines(p: Placement, allocated: dict[str, dict[str, int]], backend: tuple[str, str, str] | None,
                     prefix: str = "", attention: AttentionLayout | None = None,
                     rows: RowBounds | None = None) -> list[str]:
    """The placement as gauges: layers and bytes per device (planned, and what llama.cpp allocated). prefix:
    "draft_" for a draft model's (everycycle_draft_model_layers, ...), which has no backend line of its own.
    attention: the batching mode, the attention it runs with and why, as a line of its own; rows: where the
    invariant mode bounds a decode call's rows (matmul_rows.py), a line where it does."""
    from prometheus_client import CollectorRegistry, Gauge, generate_latest

    registry = CollectorRegistry()

    def gauge(name: str, help_text: str, labels: list[str]) -> Gauge:
        return Gauge(f"everycycle_{prefix}{name}", help_text, labels, registry=registry)

    if backend is not None:
        gauge("backend_info", "What serves the tokens, and why (1).", ["backend", "device", "reason"]) \
            .labels(*backend).set(1)
    if attention is not None:
        gauge("batching_info", "The batching mode, the attention it runs with and why (1).",
              ["mode", "flash_attention", "cache_type_k", "cache_type_v", "reason"]) \
            .labels(attention.mode, attention.flash, attention.type_k, attention.type_v, attention.reason).set(1)
    if rows is not None and (decode_rows := rows.decode_rows()) is not None:
        gauge("batching_decode_rows", "The most rows (sequences and their drafts) a decode call holds so that each "
              "computes as it would alone, and why.", ["reason"]).labels(rows.reason).set(decode_rows)
    layers = gauge("model_layers", "Model layers placed on each device (the output layer counts on its device).",
                   ["device"])
    planned = gauge("device_memory_bytes", "Bytes the placement planned on each device.", ["device", "kind"])
    margin = gauge("device_memory_margin_bytes", "Bytes the plan leaves free on each device after its margin.",
                   ["device"])
    for s in p.shares:
        layers.labels(s.device).set(s.n_layers + (1 if s.holds_output else 0))
        for kind, value in (("weights", s.weights_bytes), ("kv", s.kv_bytes), ("compute", s.compute_bytes)):
            planned.labels(s.device, kind).set(value)
        margin.labels(s.device).set(s.left_bytes)
    real = gauge("device_memory_allocated_bytes", "Bytes llama.cpp reported allocating on each device.",
                 ["device", "kind"])
    for device, kinds in allocated.items():
        for kind, value in kinds.items():
            real.labels(device, kind).set(value)
    return generate_latest(registry).decode().splitlines()
