"""How many sequences may run: the planner's figures, and the governor's admission hint applied to them (pure)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Capacity:
    """What the placement planner decided the engine may run (host_runtime/placement/planner.py)."""

    n_parallel: int
    max_waiting: int
    kv_bytes_per_token: int
    kv_bytes_total: int


def sequences_allowed(throttle_level: int, n_parallel: int) -> int:
    """The governor's admission hint applied: half the sequences at level 1, one at level 2."""
    if throttle_level >= 2:
        return 1
    if throttle_level == 1:
        return max(1, n_parallel // 2)
    return n_parallel
