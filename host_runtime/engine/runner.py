"""The runner: every llama.cpp call the engine's loop makes (decode, the KV cache's sequences and their saved
state, sampler chains, logits, embeddings), on the loop thread. The scheduler (engine.py) decides what to run and
calls only this, so that it is tested against a fake runner (tests/fake_runner.py) without a model.

A decode call is a list of parts: (seq_id, first position, tokens, logits_from), where logits_from is None (no
logits wanted: a prompt chunk that is not the prompt's last), or the offset from which every row's logits are
kept (its last token's for a prompt's last chunk or a plain decode token; 0 for a token and its draft, each
verified). A row to sample is named by its token's place in the call (counted over all parts), as llama.cpp's
llama_get_logits_ith names it.
"""

from __future__ import annotations

import ctypes
import logging
import time
from collections.abc import Callable

import numpy as np

from host_runtime.common.errors import EveryCycleError
from host_runtime.engine.cpu_share import ThreadShare
from host_runtime.engine.sampling import CompiledGrammar, build_sampler_chain, token_logprobs
from host_runtime.engine.wire import SamplingParams, TokenLogprob, TopLogprob

DecodePart = tuple[int, int, list[int], int | None]  # (seq_id, start_pos, tokens, logits_from)
log = logging.getLogger(__name__)


class DecodeFailed(EveryCycleError, RuntimeError):
    """llama_decode refused a call (no free KV cells, or an error code)."""


class LlamaRunner:
    def __init__(self, model, on_threads: Callable[[int], None] | None = None, projector=None):
        """model: engine.model.LoadedModel (its context, weights and shape); on_threads: told the CPU threads the
        calls use, at the start and whenever that changes; projector: the model's (engine/projector.py), for
        images."""
        from llama_cpp._internals import LlamaBatch

        self.model = model
        self.projector = projector
        self._batch = LlamaBatch(n_tokens=model.n_batch, embd=0, n_seq_max=1, verbose=False)
        # Threads that follow the cores this engine gets (cpu_share.py), where every layer is on the CPU: a call
        # that waits for a GPU says nothing of the CPU's contention.
        most = max(model.n_threads, model.n_threads_decode)
        self._share = ThreadShare(most) if most > 1 and model.placement.n_gpu_layers == 0 else None
        self._on_threads = on_threads or (lambda n: None)
        self._on_threads(most)

    # ---- decoding -------------------------------------------------------------------------------------------

    def decode(self, parts: list[DecodePart]) -> None:
        """One llama_decode of these parts; DecodeFailed when llama.cpp refuses it."""
        import llama_cpp

        batch = self._batch.batch
        j = 0
        for seq_id, start_pos, tokens, logits_from in parts:
            keep_from = len(tokens) if logits_from is None else logits_from
            for offset, token in enumerate(tokens):
                batch.token[j] = token
                batch.pos[j] = start_pos + offset
                batch.n_seq_id[j] = 1
                batch.seq_id[j][0] = seq_id
                batch.logits[j] = offset >= keep_from
                j += 1
        batch.n_tokens = j
        if self._share is None:
            rc = llama_cpp.llama_decode(self.model.ctx.ctx, batch)
        else:
            wall, cpu = time.perf_counter(), time.process_time()
            rc = llama_cpp.llama_decode(self.model.ctx.ctx, batch)
            threads = self._share.observe(time.perf_counter() - wall, time.process_time() - cpu, time.monotonic())
            if threads is not None:
                self._use_threads(threads)
        if rc != 0:
            raise DecodeFailed("no free KV cache cells" if rc == 1 else f"llama_decode returned {rc}")

    def decode_media(self, seq_id: int, start_pos: int, chunk) -> None:
        """An image (projector.MediaChunk) encoded and decoded into the sequence at start_pos, its places."""
        try:
            self.projector.decode(self.model.ctx.ctx, chunk, start_pos, seq_id, self.model.n_batch)
        except RuntimeError as exc:
            raise DecodeFailed(str(exc)) from None

    def _use_threads(self, threads: int) -> None:
        import llama_cpp

        llama_cpp.llama_set_n_threads(self.model.ctx.ctx, min(threads, self.model.n_threads_decode),
                                      min(threads, self.model.n_threads))
        log.info("llama.cpp calls now use %d of %d CPU threads (%s)", threads, self._share.most,
                 "trying one more" if self._share._probing else
                 "the cores are held by another process" if threads < self._share.most else "the cores are free")
        self._on_threads(threads)

    def warm_up_part(self, n_tokens: int) -> DecodePart:
        """A short prompt chunk on sequence 0 (forgotten after): the warm-up's call."""
        n = max(1, min(n_tokens, self.model.n_batch, self.model.n_ctx_per_seq - 1))
        token = self.model.model.token_bos()
        return (0, 0, [token if token >= 0 else 0] * n, n - 1)

    # ---- the KV cache's sequences ---------------------------------------------------------------------------

    def forget(self, seq_id: int, from_pos: int = 0) -> None:
        """Drop the sequence's cells from `from_pos` on (0: all of it)."""
        import llama_cpp

        llama_cpp.llama_memory_seq_rm(self.model.ctx.memory, seq_id, from_pos if from_pos else -1, -1)

    def save(self, seq_id: int) -> bytes:
        """The sequence's KV state, as llama.cpp serializes it."""
        import llama_cpp

        ctx = self.model.ctx.ctx
        size = llama_cpp.llama_state_seq_get_size(ctx, seq_id)
        buf = (ctypes.c_uint8 * size)()
        written = llama_cpp.llama_state_seq_get_data(ctx, buf, size, seq_id)
        return bytes(buf)[:written]

    def restore(self, seq_id: int, data: bytes) -> bool:
        """Load a saved state into the sequence; False (the sequence left empty) when llama.cpp refuses it."""
        import llama_cpp

        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        read = llama_cpp.llama_state_seq_set_data(self.model.ctx.ctx, buf, len(data), seq_id)
        if read != len(data):
            self.forget(seq_id)
            return False
        return True

    # ---- sampling ---------------------------------------------------------------------------------------------

    def compile_grammar(self, grammar: str) -> CompiledGrammar:
        """Parsed on the caller's thread (any thread: it touches only the vocabulary); GrammarRejected if refused."""
        return CompiledGrammar(self.model.model, grammar)

    def sampler(self, sampling: SamplingParams, choice_index: int, grammar: CompiledGrammar | None):
        """A fresh chain for one sequence (it owns its RNG, penalties and grammar state); `.close()` frees it."""
        return build_sampler_chain(self.model.model, sampling, choice_index, grammar)

    def sample(self, sampler, row: int) -> int:
        return sampler.sample(self.model.ctx, row)

    def logprobs(self, row: int, token: int, top_n: int) -> TokenLogprob:
        import llama_cpp

        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(self.model.ctx.ctx, row),
                                       shape=(self.model.n_vocab,))
        chosen, top = token_logprobs(logits, token, top_n)
        return TokenLogprob(self._text(token), list(self.piece(token)), chosen,
                            [TopLogprob(self._text(t), list(self.piece(t)), lp) for t, lp in top])

    def piece(self, token: int) -> bytes:
        return self.model.token_piece(token)

    def _text(self, token: int) -> str:
        return self.piece(token).decode("utf-8", errors="replace")

    def is_end_of_generation(self, token: int) -> bool:
        return self.model.is_end_of_generation(token)

    # ---- embeddings -------------------------------------------------------------------------------------------

    def embed(self, tokens: list[int]) -> list[float]:
        """One input's pooled, unit-length embedding (the embeddings context: engine.model); a reranker's input (a
        query and document pair) gives [its score]."""
        import llama_cpp
        from llama_cpp._internals import LlamaBatch

        ctx = self.model.embeddings_context()
        ctx.kv_cache_clear()
        batch = LlamaBatch(n_tokens=len(tokens), embd=0, n_seq_max=1, verbose=False)
        batch.add_sequence(tokens, 0, logits_all=True)
        rc = llama_cpp.llama_decode(ctx.ctx, batch.batch)
        if rc != 0:
            raise DecodeFailed(f"llama_decode returned {rc}")
        if self.model.pooling == "rank":  # a reranker: its pooling gives the pair's score (llama.cpp's first of
            score = float(ctx.get_embeddings_seq(0)[0])  # n_cls_out floats), not a vector to normalise
            ctx.kv_cache_clear()
            return [score]
        n_embd = self.model.model.n_embd()
        vec = np.ctypeslib.as_array(ctx.get_embeddings_seq(0), shape=(n_embd,)).astype(np.float64)
        ctx.kv_cache_clear()
        norm = np.linalg.norm(vec)
        return (vec / norm if norm > 0 else vec).tolist()
