"""How many HTTP threads the serving API needs (pure).

A request holds a gthread thread for its whole life, waiting for a sequence included. With fewer threads than
the engine admits (running sequences plus its queue), the requests past the threads wait in gunicorn's own
queue, unseen by the engine's admission, and /health, /ready and the capability map wait behind them: a box
that is merely busy then looks dead to the fleet's gateway and to supervisord's health gate. So each worker gets
enough threads for everything the engine admits, plus a reserve for those short requests."""

from __future__ import annotations

from host_runtime.placement.planner import MAX_PARALLEL, QUEUE_PER_SEQUENCE

MIN_THREADS = 32
CONTROL_RESERVE = 16   # health, readiness, capability and metrics requests beside every admitted request


def http_threads(parallel: int | None, max_queue: int | None) -> int:
    """Threads per HTTP worker. `parallel` None: the planner may choose up to MAX_PARALLEL; `max_queue` None:
    the planner's QUEUE_PER_SEQUENCE per sequence. Each worker may be handed every connection, so each is sized
    for the engine's whole admission."""
    sequences = parallel if parallel is not None else MAX_PARALLEL
    waiting = max_queue if max_queue is not None else QUEUE_PER_SEQUENCE * sequences
    return max(MIN_THREADS, sequences + waiting + CONTROL_RESERVE)
