"""How many sequences and waiting requests a box can take, from its KV-cache budget (pure)."""

from __future__ import annotations

from dataclasses import dataclass

MAX_PARALLEL = 16  # past this, CPU decode steps get slow enough that queueing serves clients better
QUEUE_PER_SEQUENCE = 4  # waiting requests allowed per running sequence before refusing with 503


@dataclass(frozen=True)
class Capacity:
    n_parallel: int
    max_waiting: int
    kv_bytes_per_token: int
    kv_bytes_total: int


def kv_bytes_per_token(n_layer: int, n_head_kv: int, head_dim: int, bytes_per_value: int = 2) -> int:
    """K and V, every layer, f16 cache: what one token of context costs."""
    return 2 * n_layer * n_head_kv * head_dim * bytes_per_value


def plan_capacity(per_token: int, n_ctx_per_seq: int, budget_bytes: int, n_parallel: int | None = None,
                  max_waiting: int | None = None) -> Capacity:
    """Sequences that fit the budget at full context (or the operator's fixed number), and a queue to match."""
    per_seq = per_token * n_ctx_per_seq
    if n_parallel is None:
        n_parallel = max(1, min(MAX_PARALLEL, budget_bytes // per_seq if per_seq else MAX_PARALLEL))
    if max_waiting is None:
        max_waiting = QUEUE_PER_SEQUENCE * n_parallel
    return Capacity(n_parallel, max_waiting, per_token, per_seq * n_parallel)


def sequences_allowed(throttle_level: int, n_parallel: int) -> int:
    """The governor's admission hint applied: half the sequences at level 1, one at level 2."""
    if throttle_level >= 2:
        return 1
    if throttle_level == 1:
        return max(1, n_parallel // 2)
    return n_parallel
