"""A stand-in for the engine's runner (host_runtime/engine/runner.py), named as such: the scheduler's tests run
against it without llama.cpp or a model.

Its "model" is a function of what the sequence holds in its KV cells, as a real one is: the next token depends on
every token decoded into that sequence so far (not on the request), so that a prefix restored from the cache, a
draft verified or a cell left behind shows up as different output. It checks what llama.cpp would refuse or
silently get wrong: a call past its token budget, positions that do not continue the sequence's cells, a sampled
row that asked for no logits."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field

from host_runtime.engine.runner import DecodeFailed
from host_runtime.engine.sampling import GrammarRejected
from host_runtime.engine.wire import TokenLogprob
from host_runtime.placement.matmul_rows import NO_BOUNDS, RowBounds


EOG = 0  # the fake vocabulary: token t is the byte t, except 0, the end of generation


def counting(history: list[int]) -> int:
    """The default model: after a lowercase letter the next one ('z' wraps to 'a'); after anything else 'a'."""
    last = history[-1] if history else None
    return ord("a") + (last - ord("a") + 1) % 26 if last is not None and ord("a") <= last <= ord("z") else ord("a")


@dataclass
class FakeModel:
    """The shape the scheduler reads from engine.model.LoadedModel."""
    n_parallel: int = 2
    n_ctx_per_seq: int = 256
    prefill_budget: int = 32   # a step's prompt tokens
    prefill_chunk: int = 16
    batch_invariant: bool = True
    boundary_tokens: frozenset = frozenset({EOG})
    cache_fingerprint: str = "fake-model"
    n_batch: int = 64          # the most tokens one call holds
    row_bounds: RowBounds = NO_BOUNDS  # where the matrix products change kernels (placement/matmul_rows.py)
    shape_blind: bool = False  # one call a step in the invariant mode (engine/model.py)

    def tokenize(self, text: str, *, add_bos: bool = False, special: bool = False) -> list[int]:
        return list(text.encode())

    def add_bos(self) -> bool:
        return False


@dataclass
class FakeChain:
    closed: bool = False

    def close(self) -> None:
        self.closed = True


@dataclass
class FakeRunner:
    model: FakeModel
    next_token: object = counting          # history -> token
    fail_decode: object = None             # parts -> True to refuse that call (DecodeFailed)
    fail_sampler: object = None            # sampling -> True to raise building the chain
    cells: dict[int, list[int]] = field(default_factory=dict)
    calls: list[list[tuple]] = field(default_factory=list)
    chains: list[FakeChain] = field(default_factory=list)
    threads: set[str] = field(default_factory=set)
    _rows: dict[int, tuple[int, int]] = field(default_factory=dict)

    def _on_loop(self) -> None:
        self.threads.add(threading.current_thread().name)

    def decode(self, parts) -> None:
        self._on_loop()
        n = sum(len(tokens) for _, _, tokens, _ in parts)
        assert 0 < n <= self.model.n_batch, f"a call of {n} tokens (at most {self.model.n_batch})"
        if self.fail_decode is not None and self.fail_decode(parts):
            raise DecodeFailed("no free KV cache cells")
        self.calls.append([(s, p, list(t), lf) for s, p, t, lf in parts])
        self._rows = {}
        row = 0
        for seq_id, start, tokens, logits_from in parts:
            cells = self.cells.setdefault(seq_id, [])
            assert start == len(cells), f"sequence {seq_id} decodes at {start} but holds {len(cells)} cells"
            cells.extend(tokens)
            for offset in range(len(tokens)):
                if logits_from is not None and offset >= logits_from:
                    self._rows[row] = (seq_id, start + offset + 1)
                row += 1
            assert len(cells) <= self.model.n_ctx_per_seq, f"sequence {seq_id} past its context"

    def warm_up_part(self, n_tokens: int):
        return (0, 0, [ord("a")] * n_tokens, n_tokens - 1)

    def forget(self, seq_id: int, from_pos: int = 0) -> None:
        del self.cells.setdefault(seq_id, [])[from_pos:]

    def save(self, seq_id: int) -> bytes:
        return json.dumps(self.cells.get(seq_id, [])).encode()

    def restore(self, seq_id: int, data: bytes) -> bool:
        self.cells[seq_id] = json.loads(data)
        return True

    def compile_grammar(self, grammar: str):
        if "refused" in grammar:
            raise GrammarRejected("llama.cpp refused the grammar made from this schema")
        return FakeChain()

    def sampler(self, sampling, choice_index: int, grammar):
        if self.fail_sampler is not None and self.fail_sampler(sampling):
            raise RuntimeError("simulated failure while building a sampler")
        chain = FakeChain()
        self.chains.append(chain)
        return chain

    def sample(self, sampler, row: int) -> int:
        assert not sampler.closed, "sampling with a closed chain"
        seq_id, upto = self._rows.pop(row)  # KeyError: a row that asked for no logits
        return self.next_token(self.cells[seq_id][:upto])

    def logprobs(self, row: int, token: int, top_n: int) -> TokenLogprob:
        return TokenLogprob(self.piece(token).decode(), list(self.piece(token)), -0.5, [])

    def piece(self, token: int) -> bytes:
        return b"" if token == EOG else bytes([token])

    def is_end_of_generation(self, token: int) -> bool:
        return token in self.model.boundary_tokens

    def embed(self, tokens: list[int]) -> list[float]:
        self._on_loop()
        return [1.0, 0.0]
