"""The scheduler (pure: no I/O, no llama.cpp; the caller gives the time and holds the engine's lock): who waits, who
gets a slot now, which running sequence gives its slot up for a higher class, and who ages. engine/engine.py
carries its decisions out (the KV cells saved and restored, the prefix cache's copies, the decode calls) and plans
each step's calls with step_plan.plan_step (pure too); runner.py is the one caller of llama.cpp. vLLM v1 splits its
engine core so: the scheduler decides, the model runner executes, the output processor (engine/output.py here: a
choice's bytes into text, stop strings, harmony's channels) detokenizes.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from host_runtime.engine import admission
from host_runtime.engine.errors import RequestRejected
from host_runtime.engine.prefix_cache import Running

# A request waiting or parked rises one class per AGING_S of being shut out: waiting while every running sequence
# is of a higher class (none of its own class or a lower one runs). A batch request is never shut out for longer than
# two of them (it then ranks as interactive, and nothing may park it); while its class runs, it waits its turn there.
# Counted this way, not from its arrival: a long batch job's requests, which wait behind each other, would
# otherwise all rank as interactive after two minutes and nobody could preempt them.
AGING_S = 60.0


@dataclass
class Parked:
    """A sequence taken off its slot for a higher class: its KV cells as llama.cpp saved them, and everything else
    (sampler chain and its RNG, stop matcher, decoder, drafts' state) in the Sequence itself, so that it resumes
    where it stopped and its output is what it would have been."""
    seq: Any     # engine.Sequence
    state: Any   # where its KV waits (engine/parking.py: RAM, then disk)

    @property
    def request(self):
        return self.seq.request


def _request_of(entry):
    return entry.request if isinstance(entry, Parked) else entry


class Scheduler:
    """The waiting queue, the parked sequences and each key's live requests, and the decisions on them. Requests
    are engine.GenerationRequest (rank(), class_index, n, arrived, key, cancelled, shut_out_s, prompt_tokens,
    cache_scope); running sequences have .request, .seq_id and .n_past."""

    def __init__(self, max_waiting: int, now: float):
        self.max_waiting = max_waiting
        self.waiting: collections.deque = collections.deque()
        self.parked: list[Parked] = []
        self.live_per_key: collections.Counter[str] = collections.Counter()
        self.aged_at = now  # the last look of age()

    def has_work(self) -> bool:
        return bool(self.waiting or self.parked)

    # ---- admission to the queue ---------------------------------------------------------------------------------

    def enqueue(self, request) -> None:
        """The request waits; RequestRejected where its key has max_concurrent requests live or the queue has no
        room for it (engine/admission.py: a key's share, batch kept from the last places)."""
        live = self.live_per_key[request.key] if request.key else 0
        if request.key and request.key_max_concurrent and live >= request.key_max_concurrent:
            raise RequestRejected(429, f"the key {request.key!r} has {live} requests running or waiting; its "
                                  f"limit is {request.key_max_concurrent} at once (keys set-limit)",
                                  code="concurrency_limit_exceeded", retry_after=1)
        refused = admission.refusal(collections.Counter(r.key for r in self.waiting), len(self.waiting),
                                    self.max_waiting, request.key or None, request.priority)
        if refused is not None:
            raise refused
        request.open_choices = request.n
        if request.key:
            self.live_per_key[request.key] += 1
        self.waiting.append(request)

    def settle(self, request) -> bool:
        """The request is answered, failed or dropped: its key's live count goes down, once. True where this was
        the once, for a request with a key (its usage is then counted)."""
        counted = bool(request.key) and not request.settled
        if counted:
            self.live_per_key[request.key] -= 1
            if self.live_per_key[request.key] <= 0:
                del self.live_per_key[request.key]
        request.settled = True
        return counted

    def drop_cancelled(self) -> tuple[list, list[Parked]]:
        """The cancelled waiting requests and parked sequences, taken out (the caller settles them and frees what
        the parked ones hold)."""
        requests = [r for r in self.waiting if r.cancelled.is_set()]
        for request in requests:
            self.waiting.remove(request)
        parked = [p for p in self.parked if p.request.cancelled.is_set()]
        for entry in parked:
            self.parked.remove(entry)
        return requests, parked

    # ---- who runs -------------------------------------------------------------------------------------------------

    def age(self, now: float, active: list) -> None:
        """Waiting and parked requests that only higher classes' sequences kept out since the last look age by the
        time between (AGING_S): a class that has one running is served, in its turn, and does not age."""
        elapsed, self.aged_at = now - self.aged_at, now
        if not self.has_work() or not active:
            return
        lowest_running = max(s.request.class_index for s in active)
        for request in [*self.waiting, *(p.request for p in self.parked)]:
            if request.class_index > lowest_running:
                request.shut_out_s += elapsed

    def waiting_rank(self) -> int | None:
        """The best class waiting now (0 first), or None."""
        return min((r.rank() for r in self.waiting), default=None)

    def pick(self, free: int, allowed: int, busy: int, free_slots: int, running: list[Running],
             worth_waiting: Callable[[Any, list[Running]], bool]) -> list:
        """Requests (and parked sequences) that get their slots now, strictly in order of class, then arrival, and
        taken out of the queue. free: slots they may take (the governor's hint counted); allowed: sequences the
        hint allows; busy: slots in use; free_slots: slots free whatever the hint; running: the running prompts a
        new request may copy (extended by those admitted here); worth_waiting(request, running): the prefix
        cache's word that a running sequence is computing this request's prefix."""
        admitted: list = []
        for entry in sorted([*self.waiting, *self.parked], key=lambda e: (_request_of(e).rank(),
                                                                         _request_of(e).arrived)):
            is_parked = isinstance(entry, Parked)
            n = 1 if is_parked else entry.n
            # A request wanting more choices than the hint allows still runs, alone, when nothing else does.
            alone = busy == 0 and not admitted and n > allowed and free_slots >= n
            if free < n and not alone:
                break
            # Asked only of a request that would get a slot now: the prefix comparisons stay off full-queue steps.
            if n == 1 and not is_parked and worth_waiting(entry, running):
                continue  # a running sequence is computing its prefix: copied once it has (admit's "running")
            free = max(0, free - n)
            admitted.append(entry)
            if is_parked:
                self.parked.remove(entry)
            else:
                self.waiting.remove(entry)
                if n == 1:  # it will prefill: the next in line may wait for it
                    running.append(Running(-1, entry.prompt_tokens, 0, entry.cache_scope))
        return admitted

    @staticmethod
    def preemption_victim(active: list, rank: int):
        """With every slot busy and a request of class `rank` waiting: the running single-choice sequence of the
        lowest class below it (the latest to arrive among those) that gives its slot up, or None."""
        candidates = [s for s in active if s.request.n == 1 and not s.request.cancelled.is_set()
                      and s.request.rank() > rank]
        if not candidates:
            return None
        return max(candidates, key=lambda s: (s.request.rank(), s.request.arrived))

    def park(self, seq, state, now: float) -> None:
        self.parked.append(Parked(seq, state))
        seq.request.parked_at = now
        seq.request.preemptions += 1
