"""Drafting with a second, smaller model of the same vocabulary (serve --speculation draft --draft-model PATH).

The draft model has its own llama.cpp context beside the target's, placed by the same planner with what the
target left free, with one KV sequence per target slot under the same seq_id. What each holds is remembered
(`kv`), so that every step only the tokens verified since the last draft are decoded, and a slot's next request
keeps the prefix it shares with the last one. Its drafts are greedy (argmax): point masses, which the engine's
verification turns into the target's own distribution at any temperature (speculation.py).
"""

from __future__ import annotations

import logging
from dataclasses import replace

import numpy as np

from host_runtime.engine.model import ContextConfig, LoadedModel, ModelLoadError
from host_runtime.engine.speculation import (Vocabulary, catch_up_shares, common_prefix_len, draft_choice,
                                             vocabulary_difference)

log = logging.getLogger(__name__)


def vocabulary(model: LoadedModel) -> Vocabulary:
    import llama_cpp

    vocab = model.model.vocab
    return Vocabulary(kind=int(llama_cpp.llama_vocab_type(vocab)),
                      add_bos=bool(llama_cpp.llama_vocab_get_add_bos(vocab)), bos=int(llama_cpp.llama_vocab_bos(vocab)),
                      add_eos=bool(llama_cpp.llama_vocab_get_add_eos(vocab)), eos=int(llama_cpp.llama_vocab_eos(vocab)),
                      texts=tuple(llama_cpp.llama_vocab_get_text(vocab, i) or b"" for i in range(model.n_vocab)))


def draft_context_config(target: LoadedModel, config: ContextConfig) -> ContextConfig:
    """The draft's settings: the target's slots and context, the planner's own choice of devices (explicit layer
    counts and splits are the target's), and one shared KV buffer, as drafts need no batch invariance: the
    target's verification decides every token."""
    return replace(config, n_ctx_per_seq=target.n_ctx_per_seq, n_parallel=target.n_parallel, max_waiting=0,
                   batch_invariant=False, n_gpu_layers=None, tensor_split=None)


class DraftModel:
    def __init__(self, model: LoadedModel, p_min: float = 0.0):
        from llama_cpp._internals import LlamaBatch

        self.model = model
        self.p_min = p_min
        self.kv: dict[int, list[int]] = {}  # seq_id -> the tokens its KV sequence holds, in order
        self._batch = LlamaBatch(n_tokens=model.n_batch, embd=0, n_seq_max=1, verbose=False)

    @classmethod
    def load(cls, path: str, target: LoadedModel, config: ContextConfig, p_min: float = 0.0,
             on_progress=None) -> "DraftModel":
        """Place and load the draft after the target (so the planner sees what the target left), and refuse one
        whose tokens do not mean the target's."""
        draft = LoadedModel(path, draft_context_config(target, config), on_progress=on_progress)
        why = vocabulary_difference(vocabulary(target), vocabulary(draft))
        if why is None and draft.n_parallel != target.n_parallel:
            why = (f"it fits {draft.n_parallel} sequences beside the target, which runs {target.n_parallel}; "
                   "lower --parallel or free memory")
        if why is not None:
            raise ModelLoadError(f"--draft-model {draft.model_id} cannot draft for {target.model_id}: {why}")
        log.info("draft model %s: %d sequences of %d tokens", draft.model_id, draft.n_parallel, draft.n_ctx_per_seq)
        return cls(draft, p_min)

    def draft(self, wanted: dict[int, tuple[list[int], int]]) -> dict[int, list[int]]:
        """Up to k tokens after each history (seq_id -> (history, k)): one call brings every KV sequence up to
        its history (as much as the call holds; a sequence left behind drafts in a later step), then one call
        per drafted position for the sequences still drafting."""
        import llama_cpp

        memory = self.model.ctx.memory
        pending: dict[int, list[int]] = {}
        for seq_id, (history, k) in wanted.items():
            if k <= 0 or len(history) + k > self.model.n_ctx_per_seq:
                continue
            kv = self.kv.setdefault(seq_id, [])
            # The last history token is always decoded again: its logits give the first draft token.
            keep = min(common_prefix_len(kv, history), len(history) - 1)
            if keep < len(kv):
                llama_cpp.llama_memory_seq_rm(memory, seq_id, keep, -1)
                del kv[keep:]
            pending[seq_id] = history[keep:]
        shares = catch_up_shares({s: len(t) for s, t in pending.items()}, self.model.n_batch)
        rows = self._decode({s: pending[s][:n] for s, n in shares.items()},
                            wants={s for s, n in shares.items() if n == len(pending[s])})
        # The catch-up's last rows give each sequence its first token; each later call, one more for the
        # sequences that still want one and whose draft model was sure enough of the last.
        drafts: dict[int, list[int]] = {}
        while rows:
            live = []
            for seq_id, row in rows.items():
                token = self._next_token(row)
                if token is None:
                    continue
                drafts.setdefault(seq_id, []).append(token)
                if len(drafts[seq_id]) < wanted[seq_id][1]:
                    live.append(seq_id)
            rows = self._decode({s: drafts[s][-1:] for s in live}, wants=set(live))
        return drafts

    def _next_token(self, row: int) -> int | None:
        """The draft model's token at this batch row; None where p_min is set and its probability is below it
        (the softmax over the vocabulary is only computed then)."""
        logits = self._logits(row)
        if not self.p_min:
            return int(np.argmax(logits))
        token, p = draft_choice(logits)
        return token if p >= self.p_min else None

    def _decode(self, tokens: dict[int, list[int]], wants: set[int]) -> dict[int, int]:
        """One llama_decode of each sequence's tokens after what its KV holds; the batch row of the last token
        of each sequence in `wants`, whose logits are then readable until the next call."""
        import llama_cpp

        batch = self._batch.batch
        batch.n_tokens = 0
        rows = {}
        for seq_id, part in tokens.items():
            kv = self.kv[seq_id]
            for offset, token in enumerate(part):
                j = batch.n_tokens
                batch.token[j] = token
                batch.pos[j] = len(kv) + offset
                batch.n_seq_id[j] = 1
                batch.seq_id[j][0] = seq_id
                batch.logits[j] = seq_id in wants and offset == len(part) - 1
                batch.n_tokens += 1
            if seq_id in wants:
                rows[seq_id] = batch.n_tokens - 1
        if batch.n_tokens == 0:
            return {}
        rc = llama_cpp.llama_decode(self.model.ctx.ctx, batch)
        if rc != 0:
            # What the KV holds is no longer known: start every sequence over rather than draft from a guess.
            llama_cpp.llama_memory_clear(self.model.ctx.memory, True)
            self.kv.clear()
            raise RuntimeError("the draft model's decode failed: " +
                               ("no free KV cache cells" if rc == 1 else f"llama_decode returned {rc}"))
        for seq_id, part in tokens.items():
            self.kv[seq_id].extend(part)
        return rows

    def _logits(self, row: int) -> np.ndarray:
        import llama_cpp

        return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(self.model.ctx.ctx, row),
                                     shape=(self.model.n_vocab,))
