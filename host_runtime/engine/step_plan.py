"""Which tokens go into the next llama_decode call (pure; no llama.cpp here).

Every decoding sequence contributes its one pending token first, so streams
already running never wait behind a prompt; the rest of the per-step token
budget goes to prompt chunks (chunked prefill), oldest request first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence


class Schedulable(Protocol):
    seq_id: int
    n_past: int

    def pending_tokens(self) -> Sequence[int]: ...
    def is_prefilling(self) -> bool: ...


@dataclass(frozen=True)
class BatchSlice:
    seq: Schedulable
    tokens: Sequence[int]
    start_pos: int
    wants_logits: bool  # True when this slice ends at the point the sequence samples from


def plan_step(active: Sequence[Schedulable], token_budget: int) -> list[BatchSlice]:
    """Slices for one decode call, at most `token_budget` tokens in all (at least one per decoder)."""
    plan: list[BatchSlice] = []
    used = 0
    for seq in active:
        if not seq.is_prefilling():
            pending = seq.pending_tokens()
            if pending:
                plan.append(BatchSlice(seq, pending[:1], seq.n_past, True))
                used += 1
    for seq in active:
        if seq.is_prefilling() and used < token_budget:
            pending = seq.pending_tokens()
            take = min(len(pending), token_budget - used)
            if take <= 0:
                continue
            plan.append(BatchSlice(seq, pending[:take], seq.n_past, take == len(pending)))
            used += take
    return plan
