"""Which tokens go into the next decode calls (pure; no llama.cpp here).

Every decoding sequence contributes its one pending token first, so streams
already running never wait behind a prompt; then prompts advance by whole
chunks (chunked prefill), oldest request first, up to the step's prefill budget:
the oldest prompt takes as many chunks as the budget holds (each its own call,
in order), and the next only what is left. First come, first served: four
agents' turns arriving together are answered one after another, not all four
late together, as one chunk each per step would (measured: bench/serving.py
--workload agent).

Chunks are cut at fixed multiples of `chunk` counted from position 0, and
right after every end-of-generation token (where a chat message ends), never
where a budget happens to run out: llama.cpp's results for a sequence are
bit-identical only if its prompt is cut at the same places, so this is what
makes a request's output the same alone or batched. Cut points depend on the
tokens alone, so two prompts sharing their first m tokens share every cut
below m: that is what lets the prefix cache resume where a miss would cut. For the same reason the
calls are grouped so that each holds sequences with equal token counts
(llama.cpp sub-splits a call whose sequences have unequal counts).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import AbstractSet, Protocol, Sequence

from host_runtime.placement.matmul_rows import NO_BOUNDS, RowBounds


def next_cut(tokens: Sequence[int], pos: int, chunk: int, boundary_tokens: AbstractSet[int],
             media_from: int | None = None) -> int:
    """The first cut point after `pos`: the next multiple of `chunk`, or just after a boundary token. Media
    (tokens from `media_from` up: an image's places, engine/projector.py) is never cut: a cut falls before a run
    of them, and a run goes whole, however long (its embeddings are one encoder pass)."""
    if media_from is not None and pos < len(tokens) and tokens[pos] >= media_from:
        end = pos
        while end < len(tokens) and tokens[end] >= media_from:
            end += 1
        return end
    limit = min((pos // chunk + 1) * chunk, len(tokens))
    for i in range(pos, limit):
        if tokens[i] in boundary_tokens:
            return i + 1
        if media_from is not None and tokens[i] >= media_from and i > pos:
            return i
    return limit


def last_cut(tokens: Sequence[int], upto: int, chunk: int, boundary_tokens: AbstractSet[int],
             media_from: int | None = None) -> int:
    """The last cut point at or before `upto` (0 if none); never inside a run of media tokens (moved back to
    the run's start: a prefix that ends inside an image cannot be resumed)."""
    best = (upto // chunk) * chunk
    for i in range(upto - 1, best - 1, -1):
        if tokens[i] in boundary_tokens:
            best = i + 1
            break
    if media_from is not None:
        while 0 < best < len(tokens) and tokens[best - 1] >= media_from and tokens[best] >= media_from:
            best -= 1
    return best


class Schedulable(Protocol):
    seq_id: int
    n_past: int

    def pending_tokens(self) -> Sequence[int]: ...
    def is_prefilling(self) -> bool: ...
    def next_cut(self, pos: int | None = None) -> int: ...  # the first cut after pos (default: n_past)


# While a sequence is decoding, a step's prompt calls are cut to what the last prompt call's measured speed computes
# in this long (at least one chunk a step: prompts always progress): the decoding answers' next tokens wait for a
# step's prompt calls, and 512 prompt tokens at 15,000 tokens of context took about 8 s on 2 cores (the agent
# workload), one token of every other answer per 8 s. What a step leaves, the next steps compute.
STEP_PREFILL_S = 0.5


class PrefillBudget:
    """The prompt tokens a step may compute (plan_step's prefill_budget): all of `max_tokens` while no sequence
    decodes; while one does, as many as the last prompt call's measured seconds per token fit in `target_s`
    (its cost grows with the context, so the latest call is the best guess for the next), never more than
    max_tokens. Pure: the engine reports each prompt call's tokens and time."""

    def __init__(self, max_tokens: int, target_s: float = STEP_PREFILL_S):
        self.max_tokens = max_tokens
        self.target_s = target_s
        self._s_per_token: float | None = None

    def prompt_call_took(self, n_tokens: int, seconds: float) -> None:
        if n_tokens > 0 and seconds > 0:
            self._s_per_token = seconds / n_tokens

    def tokens(self, decoding: bool) -> int:
        if not decoding or self._s_per_token is None:
            return self.max_tokens
        return max(1, min(self.max_tokens, int(self.target_s / self._s_per_token)))


@dataclass(frozen=True)
class BatchSlice:
    seq: Schedulable
    tokens: Sequence[int]
    start_pos: int
    wants_logits: bool  # True when this slice ends where the sequence samples its next token


def plan_step(active: Sequence[Schedulable], prefill_budget: int, invariant: bool = True,
              rows: RowBounds = NO_BOUNDS, shape_blind: bool = False) -> list[list[BatchSlice]]:
    """The decode calls for one step: first the decoding sequences' tokens (a draft verified in the same call),
    then prompt chunks, round by round (a sequence's k-th chunk of the step in the k-th round, so its chunks run
    in order); each group split by length, and further where the model's matrix products would compute a call of
    more rows otherwise (`rows`, placement/matmul_rows.py): a decoding token as in a lone token's call, a
    prompt chunk as in its own.

    At least one prompt chunk is planned whenever a sequence is prefilling, so prompts always progress.
    Not `invariant`: everything in one call (as llama-server batches), a sequence's chunks of the step as one
    slice, one pass over the weights per step instead of one per call; a sequence's results then depend on what
    else shares its call. `shape_blind` (invariant, and the model computes every row alike in any call: its
    matrix types at every row count, its attention a query row at a time): the same one call, each row still as
    it would be alone; not while a sequence verifies a draft (its calls stay as planned above). A call's
    sequences go in ascending ids (see _by_length).
    """
    decodes: list[BatchSlice] = []
    for seq in active:
        if not seq.is_prefilling():
            pending = seq.pending_tokens()  # its next token, then its speculative draft if it has one
            if pending:
                decodes.append(BatchSlice(seq, pending, seq.n_past, True))
    rounds: list[list[BatchSlice]] = []
    used = 0
    for seq in active:
        if not seq.is_prefilling():
            continue
        pending = seq.pending_tokens()
        pos, offset, k = seq.n_past, 0, 0
        while offset < len(pending):
            take = min(seq.next_cut(pos) - pos, len(pending) - offset)
            if used and used + take > prefill_budget:
                break  # arrival order: a later prompt does not overtake an earlier one
            if k == len(rounds):
                rounds.append([])
            rounds[k].append(BatchSlice(seq, pending[offset:offset + take], pos, offset + take == len(pending)))
            used, pos, offset, k = used + take, pos + take, offset + take, k + 1
        if offset < len(pending):
            break
    if not invariant or (shape_blind and all(len(part.tokens) == 1 for part in decodes)):
        joined = decodes + _joined([part for r in rounds for part in r])
        return [sorted(joined, key=lambda part: part.seq.seq_id)] if joined else []
    return (_by_length(decodes, lambda n: rows.decode_rows())
            + [call for r in rounds for call in _by_length(r, rows.most_rows)])


def _joined(parts: list[BatchSlice]) -> list[BatchSlice]:
    """Each sequence's slices of the step as one (mixed batches: no cut needs keeping within a call)."""
    by_seq: dict[int, list[BatchSlice]] = {}
    for part in parts:
        by_seq.setdefault(id(part.seq), []).append(part)
    return [BatchSlice(run[0].seq, [t for p in run for t in p.tokens], run[0].start_pos, run[-1].wants_logits)
            for run in by_seq.values()]


def _by_length(parts: list[BatchSlice], most_rows=lambda n: None) -> list[list[BatchSlice]]:
    """Calls of equal-length slices, in the order each length first appears, each of at most most_rows(length)
    rows (None: any number; one slice a call at least)."""
    by_length: dict[int, list[BatchSlice]] = {}
    for part in parts:
        by_length.setdefault(len(part.tokens), []).append(part)
    calls = []
    for length, group in by_length.items():
        # In ascending sequence ids: with a KV stream per sequence llama.cpp computes a call as one pass only over
        # consecutive ids in ascending order, and splits it into another pass at every id out of that order
        # (llama_batch_allocr::split_equal, sequential) — each pass a read of all the weights.
        group.sort(key=lambda part: part.seq.seq_id)
        limit = most_rows(length)
        per_call = len(group) if limit is None else max(1, limit // length)
        calls += [group[i:i + per_call] for i in range(0, len(group), per_call)]
    return calls
