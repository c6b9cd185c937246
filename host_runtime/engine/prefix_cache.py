"""Prefix cache bookkeeping in three tiers (pure: decides, never touches llama.cpp or files).

- context: an idle sequence slot keeps the KV of its last prompt's aligned prefix;
- ram: a slot's prefix saved with llama_state_seq_get_data when the slot is taken by another prompt;
- disk: RAM's least recently used entries, written to files, when RAM is over its byte budget;
- running: the prompt a running sequence has prefilled so far, copied into the new sequence's slot. Agents'
  sessions start together on one long system prompt: a request whose prompt shares more with a sequence still
  prefilling than any tier holds waits until that sequence has computed the shared part (worth_waiting), and
  then copies it, so the prefix is computed once instead of once per session.

Only *prompt* tokens up to a cut point are cached (a multiple of the chunk, or just after an
end-of-generation token, see step_plan): a hit then resumes prefill exactly where a miss
would cut, so a hit's output is identical to a miss's. Where the model computes a row alike in any call
(`any_position`: model.shape_blind) there is no cut to keep: a hit resumes at any token, and a slot keeps the
answer it generated too, so a chat's next turn, which quotes that answer, computes only its new message (as
llama-server's slots do).
The policy returns actions; the engine carries them out and reports sizes back.

Scopes: an entry is found only by requests of its own scope (an API key, by default), so that whether a prompt
hits, its cached-token count and its time to first token tell no client about another's prompts. A scoped key
starts with the scope's marker, a negative int32 no token id can be (scope_marker); the shared scope (None) has
no marker, so unscoped keys read as before and the disk tier's files need no other format.
"""

from __future__ import annotations

import collections
import hashlib
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

from host_runtime.engine.step_plan import last_cut

Key = tuple[int, ...]
Scope = int | None  # None: shared by every request; else a scope_marker


def scope_marker(name: str) -> int:
    """The marker of a cache scope (an API key's name): a negative int32, which no token id is."""
    h = int.from_bytes(hashlib.sha256(name.encode("utf-8")).digest()[:4], "little")
    return -1 - h % 0x7FFFFFFF


def scoped(tokens: Key, scope: Scope) -> Key:
    return tuple(tokens) if scope is None else (scope, *tokens)


def split_scope(key: Key) -> tuple[Scope, Key]:
    return (key[0], key[1:]) if key and key[0] < 0 else (None, key)


@dataclass
class Slot:
    slot_id: int
    busy: bool = False
    prefix: Key = ()  # tokens whose KV the slot holds while idle
    last_used: int = 0
    scope: Scope = None  # whose prefix it is


@dataclass(frozen=True)
class Entry:
    key: Key
    nbytes: int


# Actions, carried out in order by the engine.
@dataclass(frozen=True)
class Spill:        # save the slot's current KV (its `key` prefix) into RAM
    slot_id: int
    key: Key


@dataclass(frozen=True)
class Demote:       # move a RAM entry to disk
    key: Key


@dataclass(frozen=True)
class DropRam:
    key: Key


@dataclass(frozen=True)
class DropDisk:
    key: Key


@dataclass(frozen=True)
class Restore:      # clear the slot, load `key` from `tier` into it
    slot_id: int
    tier: str
    key: Key


@dataclass(frozen=True)
class Copy:         # clear the slot, load the KV slot `source` holds (a running sequence's so far, or an idle one's)
    source: int
    slot_id: int


@dataclass(frozen=True)
class Running:
    """A running single-choice sequence, as the cache sees it: its slot, its whole prompt, how much of it is in
    its KV (n_past, capped at the prompt's length) and whose it is."""

    slot_id: int
    prompt: Sequence[int]  # the request's own token list, not a copy
    prefilled: int
    scope: Scope = None


@dataclass(frozen=True)
class Trim:         # keep only the first `keep` positions of the slot (0: clear it)
    slot_id: int
    keep: int


@dataclass
class Admission:
    slot_id: int
    reuse: int                  # prompt tokens whose KV is in place after the actions
    source: str                 # "context", "running", "ram", "disk" or "miss"
    actions: list = field(default_factory=list)


def common_prefix(a, b) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class PrefixCache:
    def __init__(self, n_slots: int, chunk: int, ram_budget: int, disk_budget: int, enabled: bool = True,
                 boundary_tokens: frozenset[int] = frozenset(), media_from: int | None = None,
                 any_position: bool = False):
        """media_from: token ids from here up are an image's places (engine/projector.py): a prefix never ends
        inside an image's run. any_position: a prefix may end at any token (no cut points)."""
        self.slots = [Slot(i) for i in range(n_slots)]
        self.chunk = chunk
        self.boundary_tokens = boundary_tokens
        self.media_from = media_from
        self.ram_budget = ram_budget
        self.disk_budget = disk_budget
        self.enabled = enabled
        self.any_position = any_position
        self.ram: collections.OrderedDict[Key, Entry] = collections.OrderedDict()
        self.disk: collections.OrderedDict[Key, Entry] = collections.OrderedDict()
        self._clock = itertools.count(1)
        self.hits = {"context": 0, "ram": 0, "disk": 0, "running": 0}
        self.lookups = 0
        self.tokens_reused = 0

    # ---- queries ----------------------------------------------------------------

    def free_slots(self) -> int:
        return sum(1 for s in self.slots if not s.busy)

    def _cut(self, tokens, upto: int) -> int:
        """The last cut point of `tokens` at or before `upto` (any position where any_position)."""
        if self.any_position:
            return upto
        return last_cut(tokens, upto, self.chunk, self.boundary_tokens, self.media_from)

    def cacheable_length(self, prompt) -> int:
        """The longest prefix of `prompt` ending at a cut point that still leaves a token to compute logits from."""
        return self._cut(prompt, len(prompt) - 1) if prompt else 0

    def aligned_match(self, key: Key, prompt) -> int:
        if not prompt:
            return 0
        return self._cut(prompt, min(common_prefix(key, prompt), len(prompt) - 1))

    def bytes_in(self, tier: str) -> int:
        return sum(e.nbytes for e in (self.ram if tier == "ram" else self.disk).values())

    # ---- admission ----------------------------------------------------------------

    def _running_match(self, prompt, scope: Scope, running) -> tuple[int, int]:
        """(tokens, slot) of the longest prefix of `prompt` that a running sequence of the same scope has in its KV
        now, at a cut point."""
        return max(((self.aligned_match(r.prompt[:r.prefilled], prompt), r.slot_id) for r in running
                    if r.scope == scope), default=(0, -1))

    def worth_waiting(self, prompt, scope: Scope = None, running=()) -> bool:
        """Whether a request should wait (not be admitted yet) for a running sequence to finish prefilling a prefix
        it shares: it shares at least two chunks more with one still prefilling than any tier holds, and no running
        sequence has all of that in its KV yet."""
        if not self.enabled or not prompt:
            return False
        coming = max((self.aligned_match(r.prompt, prompt) for r in running
                      if r.scope == scope and r.prefilled < len(r.prompt)), default=0)
        held = max(self._stored_match(prompt, scope)[0],
                   max((self.aligned_match(s.prefix, prompt) for s in self.slots if not s.busy and s.scope == scope),
                       default=0))
        if coming < held + 2 * self.chunk:
            return False
        return self._running_match(prompt, scope, running)[0] < coming

    def _stored_match(self, prompt, scope: Scope) -> tuple[int, str, Key]:
        stored = [(self.aligned_match(tokens, prompt), tier, e.key)
                  for tier, store in (("ram", self.ram), ("disk", self.disk)) for e in store.values()
                  for owner, tokens in (split_scope(e.key),) if owner == scope]
        return max(stored, default=(0, "", ()))

    def admit(self, prompt, scope: Scope = None, running=()) -> Admission:
        """Take a free slot for a new sequence with this prompt (None: a sequence that must not use the cache),
        reusing only what its own `scope` left, or what a running sequence of its scope (`running`: Running) has
        prefilled."""
        idle = [s for s in self.slots if not s.busy]
        if not idle:
            raise RuntimeError("admit() called with no free slot")
        if prompt is None or not self.enabled:
            slot = min(idle, key=self._least_worth())
            return self._take(slot, Admission(slot.slot_id, 0, "miss", self._evict_slot(slot, keep=0)))
        self.lookups += 1

        def in_slot(s: Slot) -> int:
            return self.aligned_match(s.prefix, prompt) if s.scope == scope else 0

        best_slot = max(idle, key=lambda s: (in_slot(s), -s.last_used))
        in_context = in_slot(best_slot)
        in_store = self._stored_match(prompt, scope)
        in_running, source = self._running_match(prompt, scope, running)
        # The slot whose content is least worth keeping (_least_worth): where a miss, a tier's or a running
        # sequence's prefix, or a copy of an idle slot's goes.
        slot = min(idle, key=self._least_worth())
        if in_context and in_context >= max(in_store[0], in_running):
            self.hits["context"] += 1
            self.tokens_reused += in_context
            if len(best_slot.prefix) == in_context or slot is best_slot:
                # All it holds is this prompt's (or every other slot is worth more): cut it back to the shared part,
                # saving what is cut off (another conversation's turns, past the shared system prompt) first.
                actions = self._evict_slot(best_slot, keep=in_context)
                return self._take(best_slot, Admission(best_slot.slot_id, in_context, "context", actions))
            # It holds another conversation past the shared part (agents' sessions on one system prompt): copy the
            # shared part to another slot, so that conversation's next turn still finds all of its own.
            actions = [*self._evict_slot(slot, keep=0), Copy(best_slot.slot_id, slot.slot_id),
                       Trim(slot.slot_id, in_context)]
            return self._take(slot, Admission(slot.slot_id, in_context, "context", actions))
        actions = self._evict_slot(slot, keep=0)
        if in_running > in_store[0]:
            self.hits["running"] += 1
            self.tokens_reused += in_running
            actions += [Copy(source, slot.slot_id), Trim(slot.slot_id, in_running)]
            return self._take(slot, Admission(slot.slot_id, in_running, "running", actions))
        match, tier, key = in_store
        if match:
            self.hits[tier] += 1
            self.tokens_reused += match
            store = self.ram if tier == "ram" else self.disk
            store.move_to_end(key)
            actions += [Restore(slot.slot_id, tier, key), Trim(slot.slot_id, match)]
            return self._take(slot, Admission(slot.slot_id, match, tier, actions))
        return self._take(slot, Admission(slot.slot_id, 0, "miss", actions))

    def _least_worth(self):
        """A key for min() over idle slots, how little a slot's content is worth keeping (least first): empty
        first; then, while others run, one beside a running slot; then the least recent. The running slots' ids
        stay in few runs: llama.cpp computes a call over per-sequence KV streams in a pass per run of consecutive
        ids (in-process, 8 sequences: 33.2 ms a decode call as ids 0-7, 40.2 as two runs of 4, 55.5 as four runs;
        step_plan._by_length). What a slot beside a running one held goes to the RAM tier first (_evict_slot), so
        its next turn restores it."""
        busy = {s.slot_id for s in self.slots if s.busy}  # once per choice, not once per slot weighed

        def key(slot: Slot) -> tuple:
            apart = bool(busy) and not ({slot.slot_id - 1, slot.slot_id + 1} & busy)
            return bool(slot.prefix), apart, slot.last_used
        return key

    def _take(self, slot: Slot, admission: Admission) -> Admission:
        slot.busy = True
        slot.prefix = ()
        slot.last_used = next(self._clock)
        return admission

    def _evict_slot(self, slot: Slot, keep: int) -> list:
        """Actions that cut a slot back to its first `keep` positions, saving its prefix to RAM first where that
        loses some of it and no tier has it yet."""
        actions: list = []
        key = scoped(slot.prefix, slot.scope)
        if len(slot.prefix) > keep and self.enabled and key not in self.ram and key not in self.disk:
            actions.append(Spill(slot.slot_id, key))
        actions.append(Trim(slot.slot_id, keep))
        return actions

    # ---- reports from the engine ------------------------------------------------------

    def restore_failed(self, tier: str, key: Key) -> None:
        """A stored entry could not be loaded (corrupt, truncated, gone): forget it; that admission was a miss."""
        (self.ram if tier == "ram" else self.disk).pop(key, None)
        self.hits[tier] -= 1

    def release(self, slot_id: int, in_kv, cacheable: bool, scope: Scope = None) -> Trim:
        """A sequence left: its slot keeps the tokens in its KV (`in_kv`: the prompt it had prefilled, and where
        any_position the tokens it generated after it) up to their last cut point (or nothing), as `scope`'s."""
        slot = self.slots[slot_id]
        slot.busy = False
        slot.scope = scope
        slot.last_used = next(self._clock)
        keep = self._cut(in_kv, len(in_kv)) if (cacheable and self.enabled) else 0
        slot.prefix = tuple(in_kv[:keep])
        return Trim(slot_id, keep)

    def stored_in_ram(self, key: Key, nbytes: int) -> list:
        """A spill completed; returns the demotions and drops that keep RAM and disk within budget."""
        actions: list = []
        self.ram[key] = Entry(key, nbytes)
        while self.ram and self.bytes_in("ram") > self.ram_budget:
            old = next(iter(self.ram))
            entry = self.ram.pop(old)
            if self.disk_budget >= entry.nbytes:
                self.disk[old] = entry
                actions.append(Demote(old))
            else:
                actions.append(DropRam(old))
        while self.disk and self.bytes_in("disk") > self.disk_budget:
            old = next(iter(self.disk))
            self.disk.pop(old)
            actions.append(DropDisk(old))
        return actions

    def found_on_disk(self, key: Key, nbytes: int) -> bool:
        """An entry left on disk by an earlier run, checked and adopted at start if the budget has room."""
        if key not in self.disk and self.bytes_in("disk") + nbytes <= self.disk_budget:
            self.disk[key] = Entry(key, nbytes)
            return True
        return False
