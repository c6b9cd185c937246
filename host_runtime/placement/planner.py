"""The placement planner (pure): which layers of a model go to which GPU, and whether it all fits.

Inputs are data: the devices as llama.cpp sees them (free memory, a bandwidth class), the host's RAM, and the
model's tensor table. The output is a Placement that llama.cpp can be told exactly (n_gpu_layers, a device
list and a tensor_split of layer counts), with the bytes each device will hold for weights, KV and compute.

llama.cpp places the GPU layers as one run at the top of the model, the output layer last, cut into
consecutive pieces in device-list order (llama-model.cpp: `i_gpu_start`, `splits`); the input embedding
stays on the CPU. The planner fills the fastest card first from the top (so it also holds the output
head), the next fastest below it, and the CPU takes what is left; the device list handed to llama.cpp
is that fill order reversed, and the split is the layer counts, so the plan and the load agree exactly.

A mixture-of-experts model whose layers do not all fit on the GPUs keeps its routed experts in host RAM (a token
reads only a few of them, so the CPU's share of the work is small) and the rest of every layer on the GPUs: the
experts of layers [0, n_cpu_moe) stay on the CPU, as llama-server's --n-cpu-moe N does through its tensor
buffer-type overrides, with N the fewest that let every layer's attention and shared tensors onto the GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from host_runtime.common.errors import EveryCycleError
from host_runtime.placement.kv_types import DEFAULT_KV
from host_runtime.placement.model_table import ModelTable, experts_override_pattern

MIB = 1 << 20
GIB = 1 << 30
MARGIN_FRACTION = 0.05      # a card is never planned past 95% of its memory ...
MARGIN_MIN_BYTES = 512 * MIB  # ... nor closer than 512 MiB to full
HOST_RESERVE_MIN_BYTES = 1 * GIB  # left to the OS, the services and the page cache's working set
MAX_PARALLEL = 16           # past this, CPU decode steps get slow enough that queueing serves clients better
QUEUE_PER_SEQUENCE = 4      # waiting requests allowed per running sequence before refusing with 503
MIN_CTX = 1024              # below this a lowered context is useless to a chat client: refuse instead
CPU_BANDWIDTH_GBPS = 40.0   # a dual-channel DDR4 desktop; used only to compare placements, never to refuse


class PlacementError(EveryCycleError):
    """A placement that cannot work; the message is one sentence with the numbers."""


@dataclass(frozen=True)
class Device:
    """One GPU as llama.cpp sees it."""

    name: str                 # llama.cpp's device name: "CUDA0", "Vulkan1"
    description: str
    free_bytes: int
    total_bytes: int
    bandwidth_gbps: float
    pci_address: str | None = None
    backend: str = ""         # "CUDA", "Vulkan"

    def margin_bytes(self, fraction: float = MARGIN_FRACTION, minimum: int = MARGIN_MIN_BYTES) -> int:
        if self.backend == "RPC":
            return 0  # another box's device: free_bytes is what it lends, its margin already kept (shard/facts.py)
        return max(int(self.total_bytes * fraction), minimum)


BUDGET_DESCRIPTION = "the models' budget (serve's --models-memory-mib)"


@dataclass(frozen=True)
class Host:
    available_bytes: int
    total_bytes: int
    bandwidth_gbps: float = CPU_BANDWIDTH_GBPS
    numa_nodes: int = 1
    budget_bytes: int | None = None  # the most of it a model may take (serve's --models-memory-mib); None: no bound

    def _default_reserve(self) -> int:
        return max(int(self.total_bytes * MARGIN_FRACTION), HOST_RESERVE_MIN_BYTES)

    def reserve_bytes(self) -> int:
        """What the plan leaves free: the reserve, or more where the budget is below what is available."""
        if self.budget_bytes is None:
            return self._default_reserve()
        return max(self._default_reserve(), self.available_bytes - self.budget_bytes)

    def budget_binds(self) -> bool:
        """Whether the budget, not what is available, bounds the plan."""
        return self.reserve_bytes() > self._default_reserve()


@dataclass(frozen=True)
class PlanRequest:
    n_ctx_per_seq: int = 4096
    n_parallel: int | None = None          # None: as many as kv_budget_bytes holds at full context (up to 16)
    kv_budget_bytes: int = 1 << 30
    max_waiting: int | None = None
    n_ubatch: int = 512
    margin_fraction: float = MARGIN_FRACTION
    margin_min_bytes: int = MARGIN_MIN_BYTES
    cpu_only: bool = False
    # Explicit settings, as llama-server takes them; None: the planner decides.
    n_gpu_layers: int | None = None
    tensor_split: tuple[float, ...] | None = None
    # Compute-buffer bytes llama.cpp reported for this model and settings (the proof), by device name.
    measured_compute: dict[str, int] = field(default_factory=dict)
    kv_types: tuple[str, str] = DEFAULT_KV   # the KV cache's K and V types (placement/kv_types.py)
    # MoE: keep the expert weights of layers [0, n_cpu_moe) in host RAM (llama-server's --n-cpu-moe; its
    # --cpu-moe is every layer). None: the planner decides; 0 for a dense model.
    n_cpu_moe: int | None = None


@dataclass(frozen=True)
class Share:
    """What one device holds. Layers are [first, last) in model order; the CPU also holds the input layer."""

    device: str
    description: str
    first_layer: int
    last_layer: int
    holds_output: bool
    weights_bytes: int
    kv_bytes: int
    compute_bytes: int
    capacity_bytes: int       # what the plan may use: free memory less the margin
    free_bytes: int
    margin_bytes: int
    compute_measured: bool = False
    expert_bytes: int = 0     # of weights_bytes, routed experts' (on the CPU: also those of GPU layers)

    @property
    def n_layers(self) -> int:
        return self.last_layer - self.first_layer

    @property
    def used_bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes + self.compute_bytes

    @property
    def left_bytes(self) -> int:
        return self.capacity_bytes - self.used_bytes


@dataclass(frozen=True)
class Placement:
    model: str
    n_layer: int
    n_ctx_per_seq: int
    n_parallel: int
    max_waiting: int
    kv_bytes_per_token: int
    shares: tuple[Share, ...]   # the GPUs in llama.cpp's device order, then the CPU
    n_gpu_layers: int           # llama.cpp's count, the output layer included
    notes: tuple[str, ...] = ()
    explicit: bool = False
    kv_types: tuple[str, str] = DEFAULT_KV  # the KV cache's K and V types, as llama.cpp is to be given them
    n_cpu_moe: int = 0          # layers [0, n_cpu_moe) keep their expert weights in host RAM
    expert_read_fraction: float = 1.0  # of expert bytes, the share a token reads (for estimates)

    @property
    def experts_pattern(self) -> str | None:
        """The tensor buffer-type override that keeps those experts in host RAM, as llama.cpp is to be told it;
        None where every layer's experts go with their layer. Only layers on a GPU need it (the rest are on the
        CPU anyway), but the pattern names all of [0, n_cpu_moe), as llama-server's --n-cpu-moe does."""
        if not self.n_cpu_moe or not self.gpu_shares:
            return None
        return experts_override_pattern(self.n_cpu_moe, self.n_layer)

    @property
    def gpu_shares(self) -> tuple[Share, ...]:
        return tuple(s for s in self.shares if s.device != "CPU")

    @property
    def cpu_share(self) -> Share:
        return self.shares[-1]

    @property
    def device_order(self) -> tuple[str, ...]:
        return tuple(s.device for s in self.gpu_shares)

    @property
    def tensor_split(self) -> tuple[float, ...]:
        """Per device in device_order: its layer count, the output layer counted where it goes."""
        return tuple(float(s.n_layers + (1 if s.holds_output else 0)) for s in self.gpu_shares)

    @property
    def kv_bytes_total(self) -> int:
        return sum(s.kv_bytes for s in self.shares)

    def decode_seconds_per_token(self, bandwidth: dict[str, float]) -> float:
        """Weights read once per token on each device (of the experts, the share a token is routed to): a
        bandwidth-bound estimate for comparing placements."""
        def read(s: Share) -> float:
            return s.weights_bytes - s.expert_bytes * (1.0 - self.expert_read_fraction)
        return sum(read(s) / (bandwidth.get(s.device, CPU_BANDWIDTH_GBPS) * 1e9) for s in self.shares)

    def summary(self) -> str:
        parts = [f"{s.device} {s.n_layers}{'+out' if s.holds_output else ''}" for s in self.shares]
        experts = f"; experts of layers 0-{self.n_cpu_moe - 1} on the CPU" if self.experts_pattern else ""
        return (f"{self.model}: layers {', '.join(parts)} of {self.n_layer}{experts}; context {self.n_ctx_per_seq} x "
                f"{self.n_parallel} sequences")

    def to_json(self) -> dict:
        return {
            "model": self.model, "n_layer": self.n_layer, "n_ctx_per_seq": self.n_ctx_per_seq,
            "n_parallel": self.n_parallel, "max_waiting": self.max_waiting, "n_gpu_layers": self.n_gpu_layers,
            "kv_bytes_per_token": self.kv_bytes_per_token, "cache_type_k": self.kv_types[0],
            "cache_type_v": self.kv_types[1],
            "device_order": list(self.device_order), "tensor_split": list(self.tensor_split),
            "explicit": self.explicit, "notes": list(self.notes), "n_cpu_moe": self.n_cpu_moe,
            "experts_override": self.experts_pattern,
            "devices": [{"device": s.device, "description": s.description, "layers": [s.first_layer, s.last_layer],
                         "n_layers": s.n_layers, "holds_output": s.holds_output, "weights_bytes": s.weights_bytes,
                         "kv_bytes": s.kv_bytes, "compute_bytes": s.compute_bytes, "expert_bytes": s.expert_bytes,
                         "compute_measured": s.compute_measured, "used_bytes": s.used_bytes,
                         "free_bytes": s.free_bytes, "margin_bytes": s.margin_bytes,
                         "capacity_bytes": s.capacity_bytes, "left_bytes": s.left_bytes} for s in self.shares],
        }


# ---- what things cost ---------------------------------------------------------------------------------

def compute_estimate(model: ModelTable, n_ubatch: int, n_ctx_per_seq: int, holds_output: bool, on_gpu: bool) -> int:
    """llama.cpp's compute buffer for one device, before llama.cpp has been asked (the proof replaces it).

    The graph's largest live set for a batch of n_ubatch tokens: a few activations of width n_embd and two
    of n_ff, the attention mask over the context, and on the device holding the head the batch's logits.
    Fitted to llama.cpp's dry-run figures for llama-layout models (see bench/placement.py)."""
    act = n_ubatch * 4 * (4 * model.n_embd + 2 * model.n_ff)
    mask = n_ubatch * _pad(n_ctx_per_seq, 256) * 2
    attn = n_ubatch * model.n_head * 4 * 64 if on_gpu else 0
    logits = n_ubatch * model.n_vocab * 4 if holds_output else 0
    return act + mask + attn + logits


def weights_pad(device: Device | None):
    """Bytes a tensor takes in that device's buffer, where the backend pads (CUDA); None: its plain size."""
    if device is None or device.backend != "CUDA":
        return None
    import gguf

    def padded(t) -> int:
        # ggml-cuda's get_alloc_size: one row's worth of padding per quantized tensor whose rows are not
        # a multiple of 512 values.
        block, size = gguf.GGML_QUANT_SIZES.get(gguf.GGMLQuantizationType(t.ggml_type), (1, 0))
        if block == 1 or t.shape[0] % 512 == 0:
            return t.n_bytes
        return t.n_bytes + (512 - t.shape[0] % 512) // block * size
    return padded


def capacity_for(model: ModelTable, request: PlanRequest) -> tuple[int, int, int]:
    """Context per sequence (capped at the model's training length), sequences, and waiting requests."""
    n_ctx = min(request.n_ctx_per_seq, model.n_ctx_train) if model.n_ctx_train > 0 else request.n_ctx_per_seq
    per_seq = model.kv_bytes_per_token(request.kv_types) * n_ctx
    n_parallel = request.n_parallel
    if n_parallel is None:
        n_parallel = max(1, min(MAX_PARALLEL, request.kv_budget_bytes // per_seq if per_seq else MAX_PARALLEL))
    max_waiting = request.max_waiting if request.max_waiting is not None else QUEUE_PER_SEQUENCE * n_parallel
    return n_ctx, n_parallel, max_waiting


# ---- planning ------------------------------------------------------------------------------------------

def plan(model: ModelTable, devices: list[Device], host: Host, request: PlanRequest = PlanRequest()) -> Placement:
    """The placement for `request`, lowering parallel sequences, then context, where nothing else fits."""
    n_ctx, n_parallel, max_waiting = capacity_for(model, request)
    gpus = [] if request.cpu_only else list(devices)
    explicit = request.n_gpu_layers is not None or request.tensor_split is not None
    if request.cpu_only and explicit and (request.n_gpu_layers or request.tensor_split):
        raise PlacementError("--placement cpu: cannot also offload layers (--gpu-layers/--tensor-split)")
    first_error = None
    for ctx, par, note in _reductions(n_ctx, n_parallel, request.n_parallel is None):
        try:
            if explicit:
                placement = _explicit(model, gpus, host, request, ctx, par)
            else:
                placement = _auto(model, gpus, host, request, ctx, par)
        except PlacementError as exc:
            first_error = first_error or exc
            continue
        waiting = max_waiting if par == n_parallel else (request.max_waiting if request.max_waiting is not None
                                                         else QUEUE_PER_SEQUENCE * par)
        notes = placement.notes + ((note,) if note else ())
        return replace(placement, max_waiting=waiting, notes=notes)
    raise first_error or PlacementError("no context and sequence count to try")  # _reductions gives at least one


def _reductions(n_ctx: int, n_parallel: int, parallel_is_auto: bool):
    """(context, sequences, note) to try in order: as asked, fewer sequences, then a shorter context."""
    yield n_ctx, n_parallel, None
    par = n_parallel
    while par > 1:
        par //= 2
        yield n_ctx, par, f"lowered to {par} parallel sequences (from {n_parallel}) to fit"
    ctx = n_ctx
    while ctx // 2 >= MIN_CTX:
        ctx //= 2
        yield ctx, 1, f"lowered the context to {ctx} tokens (from {n_ctx}) and to 1 sequence (from {n_parallel}) to fit"


def _layer_costs(model: ModelTable, request: PlanRequest, ctx: int, par: int, dev: Device | None,
                 n_cpu_moe: int) -> list[int]:
    pad = weights_pad(dev)
    return [model.layer_weight_bytes(il, pad, experts=il >= n_cpu_moe)
            + model.kv_layer_bytes(il, ctx, par, request.n_ubatch, request.kv_types) for il in range(model.n_layer)]


def _compute(model, request, dev: Device | None, holds_output: bool, ctx: int) -> tuple[int, bool]:
    name = dev.name if dev else "CPU"
    if name in request.measured_compute:
        return request.measured_compute[name], True
    return compute_estimate(model, request.n_ubatch, ctx, holds_output, dev is not None), False


def _share(model, request, dev: Device | None, host: Host | None, first: int, last: int, holds_output: bool,
           ctx: int, par: int, n_cpu_moe: int = 0) -> Share:
    """A GPU's layers [first, last) leave the experts of those below n_cpu_moe to the CPU, whose share (always
    [0, last)) takes them besides its own layers'."""
    pad = weights_pad(dev)
    weights = sum(model.layer_weight_bytes(il, pad, experts=dev is None or il >= n_cpu_moe)
                  for il in range(first, last))
    experts = sum(model.layer_expert_bytes(il, pad) for il in range(first, last)
                  if dev is None or il >= n_cpu_moe)
    if holds_output:
        weights += model.output_weight_bytes(pad, copy_tied=dev is not None)
    if dev is None:
        weights += model.input_weight_bytes()
        hosted = sum(model.layer_expert_bytes(il) for il in range(last, min(n_cpu_moe, model.n_layer)))
        weights += hosted
        experts += hosted
    kv = sum(model.kv_layer_bytes(il, ctx, par, request.n_ubatch, request.kv_types) for il in range(first, last))
    compute, measured = _compute(model, request, dev, holds_output, ctx)
    if dev is None:
        assert host is not None, "the CPU's share is planned against the host"
        free, margin = host.available_bytes, host.reserve_bytes()
        name, desc = "CPU", BUDGET_DESCRIPTION if host.budget_binds() else "host RAM"
    else:
        free = dev.free_bytes
        margin = dev.margin_bytes(request.margin_fraction, request.margin_min_bytes)
        name, desc = dev.name, dev.description
    return Share(name, desc, first, last, holds_output, weights, kv, compute, max(0, free - margin), free, margin,
                 measured, experts)


def _auto(model: ModelTable, gpus: list[Device], host: Host, request: PlanRequest, ctx: int, par: int) -> Placement:
    """Cards faster than the host's RAM first; slower ones (lavapipe, an old card on a fast host) only take
    what the CPU cannot hold, since each of their layers decodes slower than it would on the CPU."""
    fast = [d for d in gpus if d.bandwidth_gbps > host.bandwidth_gbps]
    slow = [d for d in gpus if d.bandwidth_gbps <= host.bandwidth_gbps]
    placement = _fill_moe(model, fast, host, request, ctx, par)
    slow_note = tuple(f"{d.name} ({d.description}) unused: slower than the CPU ({d.bandwidth_gbps:g} against "
                      f"{host.bandwidth_gbps:g} GB/s)" for d in slow)
    if placement.cpu_share.left_bytes >= 0:
        placement = replace(placement, notes=placement.notes + slow_note)
    elif slow:
        placement = _fill_moe(model, fast + slow, host, request, ctx, par)
    _check(placement)
    return placement


def _fill_moe(model: ModelTable, gpus: list[Device], host: Host, request: PlanRequest, ctx: int,
              par: int) -> Placement:
    """_fill, with a MoE model's experts kept in host RAM where whole layers leave some on the CPU: the fewest
    layers' experts (from layer 0 up) that bring every layer onto the GPUs, or, where none do, all of them; the
    one of that and the whole-layer fill that reads less from slow memory a token wins."""
    if request.n_cpu_moe is not None or not model.is_moe or not gpus:
        return _fill(model, gpus, host, request, ctx, par, request.n_cpu_moe or 0)
    whole = _fill(model, gpus, host, request, ctx, par, 0)
    if whole.cpu_share.n_layers == 0:
        return whole
    split = next((p for p in (_fill(model, gpus, host, request, ctx, par, n) for n in range(1, model.n_layer + 1))
                  if p.cpu_share.n_layers == 0), None) or _fill(model, gpus, host, request, ctx, par, model.n_layer)
    bandwidth = {d.name: d.bandwidth_gbps for d in gpus} | {"CPU": host.bandwidth_gbps}
    # Of the fills the host's RAM holds (both, where neither does: the plan then says what is short), the one that
    # reads less from slow memory a token.
    fitting = [p for p in (split, whole) if p.cpu_share.left_bytes >= 0] or [split, whole]
    chosen = min(fitting, key=lambda p: p.decode_seconds_per_token(bandwidth))
    if chosen is whole:
        return whole
    on_cpu = sum(model.layer_expert_bytes(il) for il in range(chosen.cpu_share.n_layers, chosen.n_cpu_moe))
    note = (f"experts of layers 0-{chosen.n_cpu_moe - 1} kept in host RAM ({_gib(on_cpu)}; llama.cpp's --n-cpu-moe "
            f"{chosen.n_cpu_moe}) so that {model.n_layer - chosen.cpu_share.n_layers} of {model.n_layer} layers' "
            f"attention runs on the GPU (whole layers: {model.n_layer - whole.cpu_share.n_layers})")
    return replace(chosen, notes=chosen.notes + (note,))


def _fill(model: ModelTable, gpus: list[Device], host: Host, request: PlanRequest, ctx: int, par: int,
          n_cpu_moe: int = 0) -> Placement:
    order = sorted(gpus, key=lambda d: (-d.bandwidth_gbps, -d.free_bytes, d.name))
    top = model.n_layer  # layers [0, top) are not placed yet; GPUs take them from the top down
    filled: list[Share] = []
    notes: list[str] = []
    for dev in order:
        holds_output = not filled
        costs = _layer_costs(model, request, ctx, par, dev, n_cpu_moe)
        empty = _share(model, request, dev, host, top, top, holds_output, ctx, par, n_cpu_moe)
        room = empty.capacity_bytes - empty.used_bytes
        if room < 0:
            notes.append(f"{dev.name} ({dev.description}) unused: {_gib(empty.capacity_bytes)} after its margin, "
                         f"less than the {_gib(empty.used_bytes)} its first share needs")
            continue
        n = 0
        while top - n > 0 and costs[top - n - 1] <= room:
            room -= costs[top - n - 1]
            n += 1
        if n == 0 and not holds_output:
            notes.append(f"{dev.name} ({dev.description}) unused: {_gib(room)} free after its margin holds no layer "
                         f"({_gib(costs[top - 1])} each)" if top else f"{dev.name} unused: every layer is placed")
            continue
        filled.append(_share(model, request, dev, None, top - n, top, holds_output, ctx, par, n_cpu_moe))
        top -= n
    cpu = _share(model, request, None, host, 0, top, not filled, ctx, par, n_cpu_moe)
    return _placement(model, request, tuple(reversed(filled)) + (cpu,), ctx, par, tuple(notes), explicit=False,
                      n_cpu_moe=n_cpu_moe)


def _explicit(model: ModelTable, gpus: list[Device], host: Host, request: PlanRequest, ctx: int, par: int) -> Placement:
    """The operator's --gpu-layers/--tensor-split, placed by llama.cpp's own rule, then checked like a plan."""
    n_all = model.n_layer
    ngl = request.n_gpu_layers if request.n_gpu_layers is not None else n_all + 1
    if ngl and not gpus:
        raise PlacementError(f"--gpu-layers {ngl}: this box has no GPU that llama.cpp can use")
    split = request.tensor_split
    if split is not None:
        if len(split) > len(gpus):
            raise PlacementError(f"--tensor-split: {len(split)} values for {len(gpus)} GPU(s) "
                                 f"({', '.join(d.name for d in gpus) or 'none'})")
        split = tuple(split) + (0.0,) * (len(gpus) - len(split))
        if any(x < 0 for x in split) or sum(split) <= 0:
            raise PlacementError("--tensor-split: values must be non-negative with a positive sum")
    else:
        split = tuple(float(d.free_bytes) for d in gpus)  # llama.cpp's default: by free memory
    total = sum(split) or 1.0
    cumulative, acc = [], 0.0
    for x in split:
        acc += x
        cumulative.append(acc / total)
    act = min(ngl, n_all + 1) if gpus else 0
    start = max(n_all + 1 - ngl, 0)
    owner: list[int | None] = []
    for il in range(n_all + 1):  # the output layer is index n_all
        if il < start or il - start >= act:
            owner.append(None)
        else:
            pos = (il - start) / act
            owner.append(next(i for i, c in enumerate(cumulative) if c > pos))
    n_cpu_moe = min(request.n_cpu_moe or 0, n_all)
    shares = []
    for i, dev in enumerate(gpus):
        mine = [il for il in range(n_all) if owner[il] == i]
        holds_output = owner[n_all] == i
        if not mine and not holds_output:
            continue
        shares.append(_share(model, request, dev, None, mine[0] if mine else n_all, mine[-1] + 1 if mine else n_all,
                             holds_output, ctx, par, n_cpu_moe))
    cpu = _share(model, request, None, host, 0, start if act else n_all, owner[n_all] is None, ctx, par, n_cpu_moe)
    placement = _placement(model, request, tuple(shares) + (cpu,), ctx, par, (), explicit=True, n_cpu_moe=n_cpu_moe)
    _check(placement)
    return placement


def _placement(model, request, shares, ctx, par, notes, explicit, n_cpu_moe: int = 0) -> Placement:
    n_gpu = sum(s.n_layers + (1 if s.holds_output else 0) for s in shares if s.device != "CPU")
    return Placement(model=model.name, n_layer=model.n_layer, n_ctx_per_seq=ctx, n_parallel=par, max_waiting=0,
                     kv_bytes_per_token=model.kv_bytes_per_token(request.kv_types), shares=shares, n_gpu_layers=n_gpu,
                     notes=notes, explicit=explicit, kv_types=request.kv_types,
                     n_cpu_moe=min(n_cpu_moe, model.n_layer) if model.is_moe else 0,
                     expert_read_fraction=model.expert_read_fraction)


def _check(placement: Placement) -> None:
    for s in placement.shares:
        if s.left_bytes < 0:
            where = "host RAM" if s.device == "CPU" else f"{s.device} ({s.description})"
            has = (f"{_gib(s.capacity_bytes)}, {BUDGET_DESCRIPTION}" if s.description == BUDGET_DESCRIPTION
                   else f"{_gib(s.capacity_bytes)} after its {_gib(s.margin_bytes)} margin")
            raise PlacementError(
                f"{placement.model} does not fit at context {placement.n_ctx_per_seq} x {placement.n_parallel} "
                f"sequences: {where} would need {_gib(s.used_bytes)} (weights {_gib(s.weights_bytes)}, KV "
                f"{_gib(s.kv_bytes)}, compute {_gib(s.compute_bytes)}) but has {has}: short by {_gib(-s.left_bytes)}")


def _pad(x: int, n: int) -> int:
    return (x + n - 1) // n * n


def _gib(n: int) -> str:
    return f"{n / GIB:.2f} GiB" if abs(n) >= GIB else f"{n / MIB:.0f} MiB"
