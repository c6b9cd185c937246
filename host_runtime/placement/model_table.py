"""What a model costs in memory, layer by layer: its GGUF tensor table and KV-cache geometry (pure once read).

Read with ggml's own GGUF reader (gguf_c.py; the `gguf` package's GGUFReader where that is missing; no weights
are loaded), or built from hyperparameters for a
model we have no file of (`synthetic_table`), so plans for 70B-class models can be tested anywhere.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import re
from dataclasses import dataclass, field

from host_runtime.common.errors import InputError
from host_runtime.placement import gguf_c
from host_runtime.placement.gguf_split import SPLIT_COUNT, SPLIT_NO, SPLIT_TENSORS, part_name, part_names
from host_runtime.placement.kv_types import DEFAULT_KV, kv_type

# The layers of the model that llama.cpp places as units: the repeating blocks, then "output".
_BLOCK = re.compile(r"^blk\.(\d+)\.")
# A mixture-of-experts layer's routed experts (the bulk of its bytes, a few of them read per token): the tensors
# llama-server's --cpu-moe / --n-cpu-moe keep in host RAM through its tensor buffer-type overrides (common.h's
# LLM_FFN_EXPS_REGEX), searched as llama.cpp searches it (std::regex_search). Weights only: the experts' biases
# (gpt-oss) are small and stay with their layer, as ik_llama.cpp measured a faster prompt that way (its PR 841).
EXPERT_WEIGHTS = r"\.ffn_(up|down|gate|gate_up)_exps\.weight"
_EXPERT = re.compile(EXPERT_WEIGHTS)
# Sliding-window periods llama.cpp sets in code for architectures whose GGUFs do not say (llama-model.cpp
# load_hparams: set_swa_pattern).
_SWA_PERIOD_BY_ARCH = {"gpt-oss": 2}
# Tensors llama.cpp keeps on the CPU whatever the offload (the input layer).
INPUT_TENSORS = frozenset({"token_embd.weight", "token_types.weight", "position_embd.weight", "token_embd_norm.weight",
                           "token_embd_norm.bias"})


def is_expert_weight(name: str) -> bool:
    return _EXPERT.search(name) is not None


def experts_override_pattern(n_cpu_moe: int, n_layer: int) -> str:
    """The buffer-type override pattern that keeps the expert weights of layers [0, n_cpu_moe) in host RAM, as
    llama-server's --n-cpu-moe N does (one pattern for them all; --cpu-moe where they are every layer)."""
    if n_cpu_moe >= n_layer:
        return EXPERT_WEIGHTS
    return rf"^blk\.({'|'.join(str(i) for i in range(n_cpu_moe))}){EXPERT_WEIGHTS}"


class ModelTableError(InputError):
    """The file is not a GGUF this planner understands (missing hyperparameters, unknown layout)."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    ggml_type: int
    shape: tuple[int, ...]  # ne0 first, as ggml orders dimensions
    n_bytes: int


@dataclass(frozen=True)
class ModelTable:
    """Per-layer weight bytes and KV geometry: everything placement needs, nothing about values."""

    name: str
    architecture: str
    n_layer: int
    n_ctx_train: int
    n_embd: int
    n_vocab: int
    n_ff: int
    n_head: int
    layer_tensors: tuple[tuple[TensorInfo, ...], ...]  # index = layer
    input_tensors: tuple[TensorInfo, ...]   # always on the CPU (token embedding)
    output_tensors: tuple[TensorInfo, ...]  # output norm and head: the "output layer"
    # K and V widths per layer (n_head_kv * head_dim); 0 for a layer without attention (recurrent).
    kv_k_width: tuple[int, ...]
    kv_v_width: tuple[int, ...]
    swa_layers: frozenset[int] = frozenset()  # layers that attend over a sliding window
    n_swa: int = 0
    # llama.cpp reuses the token embedding as the head when a model ties them: a copy on the output device.
    tied_output: bool = False
    file_bytes: int = 0
    notes: tuple[str, ...] = field(default=())
    n_expert: int = 0        # routed experts per MoE layer (0: a dense model)
    n_expert_used: int = 0   # experts each token is routed to

    def to_json(self) -> dict:
        """The table as JSON types, for a reader in another process (never pickle: that process read untrusted
        bytes, and its answer is checked, field by field, by from_json)."""
        doc = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for key in _TENSOR_LISTS:
            doc[key] = [[t.name, t.ggml_type, list(t.shape), t.n_bytes] for t in doc[key]]
        doc["layer_tensors"] = [[[t.name, t.ggml_type, list(t.shape), t.n_bytes] for t in layer]
                                for layer in self.layer_tensors]
        doc.update(kv_k_width=list(self.kv_k_width), kv_v_width=list(self.kv_v_width),
                   swa_layers=sorted(self.swa_layers), notes=list(self.notes))
        return doc

    @classmethod
    def from_json(cls, doc) -> ModelTable:
        """The table to_json wrote; ModelTableError for anything else."""
        try:
            def tensor(v) -> TensorInfo:
                name, ggml_type, shape, n_bytes = v
                if not (isinstance(name, str) and _is_int(ggml_type) and _is_int(n_bytes)
                        and isinstance(shape, list) and all(map(_is_int, shape))):
                    raise TypeError(f"tensor {v!r}")
                return TensorInfo(name, ggml_type, tuple(shape), n_bytes)

            values = {}
            for f in dataclasses.fields(cls):
                v = doc[f.name]
                if f.name == "layer_tensors":
                    v = tuple(tuple(tensor(t) for t in layer) for layer in v)
                elif f.name in _TENSOR_LISTS:
                    v = tuple(tensor(t) for t in v)
                elif f.name in ("kv_k_width", "kv_v_width", "swa_layers", "notes"):
                    kind = str if f.name == "notes" else int
                    if not all(isinstance(x, kind) and not isinstance(x, bool) for x in v):
                        raise TypeError(f.name)
                    v = frozenset(v) if f.name == "swa_layers" else tuple(v)
                elif not isinstance(v, {"name": str, "architecture": str, "tied_output": bool}.get(f.name, int)) \
                        or (isinstance(v, bool) and f.name != "tied_output"):
                    raise TypeError(f.name)
                values[f.name] = v
            return cls(**values)
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelTableError(f"the GGUF reader's answer is not a tensor table ({exc})") from None

    @functools.cached_property
    def _expert_flags(self) -> tuple[tuple[bool, ...], ...]:
        """Per layer, per tensor: a routed expert? Read once; the planner asks per layer many times a plan."""
        return tuple(tuple(is_expert_weight(t.name) for t in layer) for layer in self.layer_tensors)

    def layer_weight_bytes(self, il: int, pad=None, experts: bool = True) -> int:
        """Layer il's weights; experts=False leaves out its routed experts (kept in host RAM)."""
        return sum(_padded(t, pad) for t, expert in zip(self.layer_tensors[il], self._expert_flags[il])
                   if experts or not expert)

    def layer_expert_bytes(self, il: int, pad=None) -> int:
        return sum(_padded(t, pad) for t, expert in zip(self.layer_tensors[il], self._expert_flags[il]) if expert)

    @functools.cached_property
    def is_moe(self) -> bool:
        return any(self.layer_expert_bytes(il) for il in range(self.n_layer))

    @property
    def expert_read_fraction(self) -> float:
        """The share of a layer's expert bytes one token reads (experts used of experts there): for estimates."""
        return self.n_expert_used / self.n_expert if self.n_expert and self.n_expert_used else 1.0

    def output_weight_bytes(self, pad=None, copy_tied: bool = True) -> int:
        """The output layer; a tied head is a second copy of the embedding on a GPU, but the same mapped
        bytes on the CPU (copy_tied=False)."""
        tied = sum(_padded(t, pad) for t in self.input_tensors if t.name == "token_embd.weight") \
            if self.tied_output and copy_tied else 0
        return sum(_padded(t, pad) for t in self.output_tensors) + tied

    def input_weight_bytes(self) -> int:
        return sum(t.n_bytes for t in self.input_tensors)

    def total_weight_bytes(self) -> int:
        return (sum(self.layer_weight_bytes(i) for i in range(self.n_layer)) + self.input_weight_bytes()
                + sum(t.n_bytes for t in self.output_tensors))

    def kv_cells(self, il: int, n_ctx_per_seq: int, n_parallel: int, n_ubatch: int) -> int:
        """KV cells llama.cpp allocates for layer `il`: one stream of n_ctx_per_seq (padded to 256) per sequence,
        or, on a sliding-window layer, only the window plus a batch."""
        per_stream = _pad(n_ctx_per_seq, 256)
        if il in self.swa_layers and self.n_swa:
            per_stream = min(per_stream, _pad(self.n_swa + n_ubatch, 256))
        return per_stream * n_parallel

    def kv_layer_bytes(self, il: int, n_ctx_per_seq: int, n_parallel: int, n_ubatch: int = 512,
                       kv_types: tuple[str, str] = DEFAULT_KV) -> int:
        return self.kv_cells(il, n_ctx_per_seq, n_parallel, n_ubatch) * self._kv_cell_bytes(il, kv_types)

    def kv_bytes_per_token(self, kv_types: tuple[str, str] = DEFAULT_KV) -> int:
        """One token of context in every (full-attention) layer: what a sequence costs per token."""
        return sum(self._kv_cell_bytes(i, kv_types) for i in range(self.n_layer))

    def _kv_cell_bytes(self, il: int, kv_types: tuple[str, str]) -> int:
        return kv_type(kv_types[0]).row_bytes(self.kv_k_width[il]) + kv_type(kv_types[1]).row_bytes(self.kv_v_width[il])


def _pad(x: int, n: int) -> int:
    return (x + n - 1) // n * n


def _padded(t: TensorInfo, pad) -> int:
    return pad(t) if pad else t.n_bytes


def _field(reader, key: str):
    f = reader.fields.get(key)
    if f is None:
        return None
    if not f.data:
        return None
    values = [f.parts[i] for i in f.data]
    if len(values) == 1 and getattr(values[0], "dtype", None) is not None and values[0].dtype.kind == "u" \
            and values[0].dtype.itemsize == 1:
        return bytes(values[0]).decode("utf-8", "replace")  # a string field
    flat = [v.tolist()[0] if hasattr(v, "tolist") and len(v) == 1 else v for v in values]
    return flat if len(flat) > 1 else flat[0]


@contextlib.contextmanager
def open_parts(path):
    """Every file of the GGUF at `path`, open for reading, in order: itself and, where its name says it is the
    first part of a split GGUF, the further parts beside it (gguf_split.py). ModelTableError naming a part that
    cannot be opened."""
    names = part_names(str(path))
    with contextlib.ExitStack() as stack:
        files = []
        for k, name in enumerate(names, start=1):
            try:
                files.append(stack.enter_context(open(name, "rb")))
            except OSError as exc:
                where = f"part {k} of {len(names)} of this split GGUF ({os.path.basename(name)})" if k > 1 else "it"
                raise ModelTableError(f"{path}: {where} cannot be read ({exc.strerror or exc})") from None
        yield files


def read_table(path) -> ModelTable:
    """The tensor table and KV geometry of a GGUF file, without reading its weights: through ggml's own reader
    (milliseconds), or the `gguf` package's where libggml-base cannot be loaded (seconds: it parses the
    vocabulary too). A split GGUF is read from its first part's path: the other parts beside it add their tensors
    and their bytes (gguf_split.py)."""
    if not gguf_c.available():
        return _read_table_gguf_package(path)
    with open_parts(path) as files:
        return read_table_fd(files[0].fileno(), str(path), tuple(f.fileno() for f in files[1:]))


def read_table_fd(fd: int, name: str, part_fds: tuple[int, ...] = ()) -> ModelTable:
    """read_table from an open file (read from its start; the caller keeps it open), named `name`: for a reader
    that may not open the path itself (models/gguf_info.py's child). part_fds: a split GGUF's other parts, open,
    in order."""
    opened: list = []
    try:
        for i, each in enumerate((fd, *part_fds)):
            try:
                opened.append(gguf_c.GGUFTable(fd=each))
            except ValueError as exc:
                raise ModelTableError(f"{name}{f' (part {i + 1})' if i else ''}: not a readable GGUF file "
                                      f"({exc})") from None
        first, *parts = opened
        tensors = _all_parts(name, first.value, [TensorInfo(*t) for t in first.tensors()],
                             [(f"{name} part {i}", t.value, [TensorInfo(*x) for x in t.tensors()])
                              for i, t in enumerate(parts, start=2)])
        return _table_from(name, first.value, tensors, sum(os.fstat(each).st_size for each in (fd, *part_fds)))
    finally:
        for table in opened:
            table.close()


def _all_parts(path, value, tensors: list[TensorInfo], parts: list) -> list[TensorInfo]:
    """The first part's tensors and, for a split GGUF, every other part's: parts [(name, value, tensors)] in
    order, each checked to be the part it should be. ModelTableError where one is missing or foreign."""
    count = value(SPLIT_COUNT)
    count = int(count) if _is_int(count) else 1
    if count < 2:
        return tensors
    if len(parts) != count - 1:
        raise ModelTableError(f"{path} is the first of {count} parts of a split GGUF, and {len(parts) + 1} were "
                              f"found: keep every part beside it, named {part_name(str(path), 2, count)} and so on")
    out = list(tensors)
    for k, (name, part_value, part_tensors) in enumerate(parts, start=1):
        if part_value(SPLIT_NO) != k or part_value(SPLIT_COUNT) != count:
            raise ModelTableError(f"{name} is not part {k + 1} of {count} of {path} (it says part "
                                  f"{(part_value(SPLIT_NO) or 0) + 1} of {part_value(SPLIT_COUNT)})")
        out += part_tensors
    declared = value(SPLIT_TENSORS)
    if _is_int(declared) and declared != len(out):
        raise ModelTableError(f"{path}: its parts hold {len(out)} tensors where the first says {declared}")
    return out


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


_TENSOR_LISTS = ("input_tensors", "output_tensors")


def _read_table_gguf_package(path) -> ModelTable:
    import gguf

    try:
        reader = gguf.GGUFReader(str(path), "r")
    except (ValueError, OSError) as exc:
        raise ModelTableError(f"{path}: not a readable GGUF file ({exc})") from None
    def tensors_of(r) -> list[TensorInfo]:
        return [TensorInfo(t.name, int(t.tensor_type), tuple(int(x) for x in t.shape), int(t.n_bytes))
                for t in r.tensors]

    names = part_names(str(path))
    try:
        parts = [gguf.GGUFReader(name, "r") for name in names[1:]]
    except (ValueError, OSError) as exc:
        raise ModelTableError(f"{path}: a part of this split GGUF is not readable ({exc})") from None
    tensors = _all_parts(path, lambda key: _field(reader, key), tensors_of(reader),
                         [(n, lambda key, r=r: _field(r, key), tensors_of(r)) for n, r in zip(names[1:], parts)])
    return _table_from(path, lambda key: _field(reader, key), tensors, sum(os.path.getsize(n) for n in names))


def _table_from(path, value, tensors: list[TensorInfo], file_bytes: int | None = None) -> ModelTable:
    """value(key) -> a metadata value (str, number, list) or None; file_bytes: the file's size (else the path's)."""
    arch = value("general.architecture")
    if not isinstance(arch, str):
        raise ModelTableError(f"{path}: no general.architecture in the GGUF metadata")

    def hp(key: str, default=None, required: bool = False):
        found = value(f"{arch}.{key}")
        if found is None:
            if required:
                raise ModelTableError(f"{path}: the GGUF has no {arch}.{key}")
            return default
        return found

    n_layer = int(hp("block_count", required=True))
    n_embd = int(hp("embedding_length", required=True))
    n_head = hp("attention.head_count", required=True)
    n_head_kv = hp("attention.head_count_kv", n_head)
    heads = _per_layer(n_head, n_layer)
    heads_kv = _per_layer(n_head_kv, n_layer)
    head_dim_default = n_embd // max(1, max(heads))
    key_len = int(hp("attention.key_length", head_dim_default))
    value_len = int(hp("attention.value_length", key_len))
    name = os.path.basename(str(path))
    return _assemble(name=name[:-5] if name.endswith(".gguf") else name, arch=arch,
                     n_layer=n_layer, n_ctx_train=int(hp("context_length", 0)), n_embd=n_embd,
                     n_ff=_first(hp("feed_forward_length", 0)), n_head=max(heads), tensors=tensors,
                     kv_k=tuple(h * key_len for h in heads_kv), kv_v=tuple(h * value_len for h in heads_kv),
                     n_swa=int(hp("attention.sliding_window", 0) or 0),
                     swa_pattern=hp("attention.sliding_window_pattern", _SWA_PERIOD_BY_ARCH.get(arch)),
                     file_bytes=os.path.getsize(path) if file_bytes is None else file_bytes, n_expert=int(hp("expert_count", 0) or 0),
                     n_expert_used=int(hp("expert_used_count", 0) or 0))


def _first(value) -> int:
    return int(value[0] if isinstance(value, list) else value)


def _per_layer(value, n_layer: int) -> list[int]:
    if isinstance(value, list):
        if len(value) != n_layer:
            raise ModelTableError(f"a per-layer hyperparameter has {len(value)} entries for {n_layer} layers")
        return [int(v) for v in value]
    return [int(value)] * n_layer


def _swa_layers(n_layer: int, n_swa: int, pattern) -> frozenset[int]:
    """Which layers use a sliding window. GGUF gives a period (every Nth layer is full attention, as
    llama.cpp's default for Gemma-style models) or a per-layer list of booleans."""
    if not n_swa or pattern is None:
        return frozenset()
    if isinstance(pattern, list):
        return frozenset(i for i, swa in enumerate(pattern[:n_layer]) if swa)
    period = int(pattern)
    if period <= 0:
        return frozenset()
    return frozenset(i for i in range(n_layer) if (i % period) < period - 1)


def _assemble(*, name, arch, n_layer, n_ctx_train, n_embd, n_ff, n_head, tensors, kv_k, kv_v, n_swa=0,
              swa_pattern=None, file_bytes=0, n_expert=0, n_expert_used=0) -> ModelTable:
    layers: list[list[TensorInfo]] = [[] for _ in range(n_layer)]
    inputs, outputs, notes = [], [], []
    n_vocab = 0
    for t in tensors:
        m = _BLOCK.match(t.name)
        if m:
            il = int(m.group(1))
            if il >= n_layer:  # e.g. an appended next-token-prediction block llama.cpp does not load by default
                notes.append(f"{t.name}: past block_count, not counted")
                continue
            layers[il].append(t)
        elif t.name in INPUT_TENSORS:
            inputs.append(t)
            if t.name == "token_embd.weight":
                n_vocab = t.shape[1] if len(t.shape) > 1 else n_vocab
        else:
            outputs.append(t)
    tied = not any(t.name == "output.weight" for t in outputs) and any(t.name == "token_embd.weight" for t in inputs)
    if any(not layer for layer in layers):
        missing = [i for i, layer in enumerate(layers) if not layer]
        raise ModelTableError(f"the GGUF has no tensors for layer(s) {missing[:5]}")
    return ModelTable(name=name, architecture=arch, n_layer=n_layer, n_ctx_train=n_ctx_train, n_embd=n_embd,
                      n_vocab=n_vocab, n_ff=n_ff, n_head=n_head,
                      layer_tensors=tuple(tuple(layer) for layer in layers), input_tensors=tuple(inputs),
                      output_tensors=tuple(outputs), kv_k_width=tuple(kv_k), kv_v_width=tuple(kv_v),
                      swa_layers=_swa_layers(n_layer, n_swa, swa_pattern), n_swa=n_swa, tied_output=tied,
                      file_bytes=file_bytes, notes=tuple(notes), n_expert=n_expert, n_expert_used=n_expert_used)


# ---- tables from hyperparameters: large models the tests have no file of --------------------------------

def ggml_nbytes(ggml_type: int, shape: tuple[int, ...]) -> int:
    """A tensor's bytes in ggml's block layout (shape in ggml's order, a row first)."""
    import gguf

    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(ggml_type)]
    n = 1
    for d in shape:
        n *= d
    if shape[0] % block:
        raise ModelTableError(f"a row of {shape[0]} values does not divide into {block}-value blocks")
    return n // block * size


def synthetic_table(*, name: str, n_layer: int, n_embd: int, n_ff: int, n_head: int, n_head_kv: int, n_vocab: int,
                    n_ctx_train: int, types: dict[str, int], head_dim: int | None = None, tied: bool = False,
                    n_swa: int = 0, swa_pattern=None, arch: str = "llama") -> ModelTable:
    """A llama-layout tensor table from hyperparameters. `types` maps a role (attn_q, attn_k, attn_v,
    attn_output, ffn_gate, ffn_up, ffn_down, token_embd, output, norm) to a GGML type number."""
    hd = head_dim or n_embd // n_head
    q, kv = n_head * hd, n_head_kv * hd

    def t(tname: str, role: str, *shape: int) -> TensorInfo:
        ty = types.get(role, types.get("norm", 0))
        return TensorInfo(tname, ty, shape, ggml_nbytes(ty, shape))

    tensors = [t("token_embd.weight", "token_embd", n_embd, n_vocab)]
    for i in range(n_layer):
        tensors += [t(f"blk.{i}.attn_norm.weight", "norm", n_embd), t(f"blk.{i}.attn_q.weight", "attn_q", n_embd, q),
                    t(f"blk.{i}.attn_k.weight", "attn_k", n_embd, kv), t(f"blk.{i}.attn_v.weight", "attn_v", n_embd, kv),
                    t(f"blk.{i}.attn_output.weight", "attn_output", q, n_embd),
                    t(f"blk.{i}.ffn_norm.weight", "norm", n_embd), t(f"blk.{i}.ffn_gate.weight", "ffn_gate", n_embd, n_ff),
                    t(f"blk.{i}.ffn_up.weight", "ffn_up", n_embd, n_ff), t(f"blk.{i}.ffn_down.weight", "ffn_down", n_ff, n_embd)]
    tensors.append(t("output_norm.weight", "norm", n_embd))
    if not tied:
        tensors.append(t("output.weight", "output", n_embd, n_vocab))
    return _assemble(name=name, arch=arch, n_layer=n_layer, n_ctx_train=n_ctx_train, n_embd=n_embd, n_ff=n_ff,
                     n_head=n_head, tensors=tensors, kv_k=(kv,) * n_layer, kv_v=(kv,) * n_layer, n_swa=n_swa,
                     swa_pattern=swa_pattern)
