"""Speculative decoding's pure parts (issue 18): drafting by prompt lookup, the draft length each sequence has
earned, the share of a step drafts may take, and the verification rules that keep the output what decoding
without speculation gives (the same tokens at temperature 0; the same distribution above it).

The engine (engine.py) drafts with NgramIndex or a draft model (draft_model.py), shares the step with
share_drafts, and verifies by sampling each drafted position with the sequence's own sampler chain, which is
the greedy rule at temperature 0 and, for a point-mass draft, the speculative sampling rule (both written out,
and tested, in tests/speculation_reference.py): a draft d is kept with
probability p(d), and at a rejection the token drawn from p is one other than d, which is the normalised
max(0, p - q) for q a point mass on d. Both drafters are point masses: a lookup proposes what followed, the draft
model its argmax (llama.cpp's speculative example verifies its draft model's tokens the same way)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import AbstractSet
from dataclasses import dataclass, field

import numpy as np

from host_runtime.engine.limits import DRAFT_MAX


@dataclass(frozen=True)
class SpeculationConfig:
    """The engine's speculation settings (serve --speculation, --draft-model)."""
    enabled: bool = False
    kind: str = "ngram"  # "ngram" (prompt lookup) or "draft" (a draft model: the engine's DraftModel)
    # The most tokens one sequence drafts in a step (serve --draft-max). Exactness does not bound it (with
    # speculation the context lays attention out so that any number of rows computes as one does: see
    # placement/kv_types.attention_layout); the step's 16 tokens and the cost of a verify call do.
    k_max: int = DRAFT_MAX  # engine/limits.py says why 12
    step_tokens: int = 16  # decode tokens a step may hold, drafts included, before drafts stop (share_drafts)
    n_max: int = 4         # the longest n-gram looked up
    n_min: int = 2         # the shortest: one-token matches draft too often wrongly to pay on a CPU
    # A draft model's draft stops at a token it gives less than this probability (0: never; llama.cpp's
    # default too): a low-confidence token is likely rejected, and everything drafted after it with it.
    p_min: float = 0.0
    # Draft only as much as the measured cost of calls says pays (share_drafts with a CallCost). False: as much
    # as the step has room for, whatever it costs (the tests that check the mechanism itself).
    cost_aware: bool = True


class NgramIndex:
    """The reference lookup's answer (tests/speculation_reference.lookup_draft), kept up to date as tokens arrive instead of searched for: for every n-gram (n_min
    to n_max tokens) the end of its latest occurrence that is not the history's own suffix. Adding a token costs
    n_max dictionary writes; a draft costs n_max lookups, whatever the prompt's length."""

    def __init__(self, tokens: Sequence[int] = (), *, n_max: int = 4, n_min: int = 2):
        self.n_max, self.n_min = n_max, n_min
        self.tokens: list[int] = []
        self._last_end: dict[tuple[int, ...], int] = {}
        self.extend(tokens)

    def extend(self, tokens: Sequence[int]) -> None:
        for token in tokens:
            # The n-grams ending at the token before this one stop being the suffix: register them now.
            end = len(self.tokens) - 1
            for n in range(self.n_min, min(self.n_max, end + 1) + 1):
                self._last_end[tuple(self.tokens[end - n + 1:end + 1])] = end
            self.tokens.append(token)

    def draft(self, k: int) -> list[int]:
        size = len(self.tokens)
        if k <= 0 or size < 2:
            return []
        for n in range(min(self.n_max, size - 1), self.n_min - 1, -1):
            end = self._last_end.get(tuple(self.tokens[size - n:]))
            if end is not None:
                return self.tokens[end + 1:end + 1 + k]
        return []


@dataclass
class DraftLength:
    """What a sequence has shown of its drafts. `acceptance` is the chance that its next draft's first token is
    kept (a moving average, from `prior`): whether it is in a stretch its drafter predicts, such as the part of
    a code edit that copies the file. Tokens further into a draft are priced by the engine's AcceptanceCurve.
    `k` is what it drafts where no cost is measured (--draft-always): doubled after a draft fully accepted, cut
    to one past what was accepted otherwise, paused while acceptance stays under `floor`, then one token every
    `retry_every` steps. Where the cost rule prices drafts (share_drafts), the length is the rule's, and a
    sequence it declines grows stale: `declined` moves its acceptance back toward the prior, and after
    `retry_every` declined steps in a row it may probe (probe_due)."""
    k_max: int = 16
    k: int = 4
    prior: float = 0.5
    acceptance: float = field(init=False)  # starts at the prior
    floor: float = 0.15
    retry_every: int = 16
    _paused_steps: int = 0
    _declined_steps: int = 0

    def __post_init__(self) -> None:
        self.acceptance = self.prior

    def record(self, drafted: int, accepted: int) -> None:
        if drafted <= 0:
            return
        self._declined_steps = 0
        self.acceptance = 0.8 * self.acceptance + 0.2 * (accepted > 0)
        self.k = min(self.k_max, self.k * 2) if accepted == drafted else max(1, accepted + 1)

    def declined(self) -> None:
        """A step in which this sequence asked for a draft and the cost rule gave it none. Without this, a
        sequence whose first drafts failed (a code edit's answer opens with prose the prompt lacks) kept an
        acceptance at which no draft pays, so it never drafted again to learn that its later ones would: on a
        code edit at c=1, 0.02 drafts per token against 0.97 when drafting always, and 0.86x its tok/s. A
        1/retry_every step of the way back per declined step: a sequence held off by a real cost tries again
        after some steps, not every step."""
        self.acceptance += (self.prior - self.acceptance) / self.retry_every
        self._declined_steps += 1

    def probe_due(self) -> bool:
        """Declined retry_every steps in a row: it may draft once whatever its acceptance says, as only a draft
        tells whether it would now be accepted (share_drafts' probes)."""
        return self._declined_steps >= self.retry_every

    def next_k(self) -> int:
        if self.acceptance >= self.floor:
            return self.k
        self._paused_steps += 1
        if self._paused_steps >= self.retry_every:
            self._paused_steps = 0
            return 1
        return 0


class AcceptanceCurve:
    """For each position i of a draft past the first, the chance its token is kept once the ones before it were,
    over every sequence of the engine (moving counts, from `prior`). Drafts are not alike along their length:
    on a code edit drafted by prompt lookup (c=1, 2 cores) the first token was kept 77% of the time, the 2nd to
    4th 90% once those before were, the 5th to 12th 86-100% (most 100%): a draft that starts right tends to
    run on, so one chance for every position (a geometric guess) prices long drafts too low. The prior is
    hopeful (0.8, worth two drafts) so that a position not yet drafted gets tried and learned, not priced out
    unseen."""

    def __init__(self, k_max: int, prior: float = 0.8, weight: float = 2.0, keep: float = 0.99):
        self.prior, self.weight, self.keep = prior, weight, keep
        self._kept = [0.0] * (k_max + 1)
        self._tried = [0.0] * (k_max + 1)

    def record(self, drafted: int, accepted: int) -> None:
        for i in range(2, min(drafted, len(self._tried) - 1) + 1):
            if accepted < i - 1:
                break  # not tried: an earlier token was refused
            self._tried[i] = self.keep * self._tried[i] + 1
            self._kept[i] = self.keep * self._kept[i] + (accepted >= i)

    def chances(self) -> list[float]:
        """The chances for positions 2, 3, ... (share_drafts' `continuation`)."""
        return [(self._kept[i] + self.prior * self.weight) / (self._tried[i] + self.weight)
                for i in range(2, len(self._tried))]


class CallCost:
    """What a decode call of n tokens costs on this box, learned from the engine's own calls (those without
    prompt chunks): a moving average of seconds per token count. A count never seen is taken to cost what the
    nearest smaller one seen costs, and between two seen counts the line through them: so a longer draft is
    tried once, and kept only if what it cost pays. On a GPU, or a CPU bound by reading the weights, a few more
    tokens in a call are nearly free; on a small CPU bound by computing them (2 cores: 15 ms for one token,
    46 ms for a 2.9-token verify) they are not, and speculation must know which."""

    def __init__(self, weight: float = 0.2):
        self.weight = weight
        self.seconds: dict[int, float] = {}

    def observe(self, n_tokens: int, seconds: float) -> None:
        old = self.seconds.get(n_tokens)
        self.seconds[n_tokens] = seconds if old is None else (1 - self.weight) * old + self.weight * seconds

    def estimate(self, n_tokens: int) -> float | None:
        """Seconds for a call of n_tokens (None: no call of n_tokens or fewer has been seen)."""
        if n_tokens in self.seconds:
            return self.seconds[n_tokens]
        below = max((n for n in self.seconds if n < n_tokens), default=None)
        above = min((n for n in self.seconds if n > n_tokens), default=None)
        if below is None:
            return None
        if above is None:
            return self.seconds[below]
        lo, hi = self.seconds[below], self.seconds[above]
        return lo + (hi - lo) * (n_tokens - below) / (above - below)


PROBE_GAIN = 1.5  # how much faster a wholly accepted probe must make the step (share_drafts)


def share_drafts(wanted: dict[int, int], acceptance: dict[int, float], n_active: int, step_tokens: int,
                 cost: CallCost | None = None, equal_lengths: bool = False,
                 draft_cost: CallCost | None = None, probes: AbstractSet[int] = frozenset(),
                 continuation: Sequence[float] | None = None) -> dict[int, int]:
    """Draft tokens per sequence for one step: the amount that maximises the step's expected tokens per second.

    `n_active` tokens (one per decoding sequence) go first; drafts fill at most `step_tokens` in all. A sequence's
    first drafted token is expected to yield its `acceptance` (DraftLength), its i-th that times the chances of
    positions 2..i in `continuation` (AcceptanceCurve; none given: its acceptance again at each), and the tokens
    expected to yield most draft first. The step's seconds are `cost`'s estimate for its token count plus, for a
    draft model, `draft_cost`'s seconds per drafted position (a draft model's call each, its catch-up shared
    among them, kept as the cost of a count of 1; none measured yet: free) times the positions drafted. Nothing
    drafts until a call of `n_active` tokens (or fewer) has been measured; counts above those measured are taken
    as dear as the largest measured, so they are tried once and learned. No `cost`: every spare token drafts.
    `equal_lengths`: every sequence must draft the same length or none drafts (the batch-invariant layout's
    one-call rule; see Engine._draft). `probes`: sequences the rule has long declined (DraftLength.probe_due)
    draft their wanted length anyway where, wholly accepted, it would make the step PROBE_GAIN times as fast
    (not with `equal_lengths`, where a probe would make every sequence draft)."""
    out = {seq: 0 for seq in wanted}
    room = max(0, step_tokens - n_active)
    if not wanted or room == 0:
        return out

    later = list(continuation or ())
    # What each token a sequence may draft this step is expected to yield, in order.
    worth: dict[int, list[float]] = {}
    for seq, k in wanted.items():
        first = chance = acceptance.get(seq, 0.0)
        worth[seq] = []
        for i in range(min(k, room)):
            if i:
                chance *= later[i - 1] if i - 1 < len(later) else first
            worth[seq].append(chance)

    # Candidate plans, each (shares, expected extra tokens, positions drafted); the first drafts nothing.
    plans: list[tuple[dict[int, int], float, int]] = [(dict(out), 0.0, 0)]
    if equal_lengths:
        if len(wanted) < n_active:
            return out  # a decoding sequence that drafts nothing: no common length
        longest = min(min(wanted.values()), room // len(wanted))
        for length in range(1, longest + 1):
            plans.append(({s: length for s in wanted}, sum(sum(worth[s][:length]) for s in wanted), length))
    else:
        # Every (sequence, i-th token) by what it yields; a sequence's own tokens yield less the later they come,
        # so each prefix of this order is the best plan of its size.
        tokens = sorted(((w, seq, i) for seq, values in worth.items() for i, w in enumerate(values)),
                        key=lambda t: (-t[0], t[1], t[2]))
        shares, gain = dict(out), 0.0
        for expected, seq, _ in tokens[:room]:
            shares[seq] += 1
            gain += expected
            plans.append((dict(shares), gain, max(shares.values())))
    if cost is None:
        return plans[-1][0]
    if cost.estimate(n_active) is None:
        return out  # first the call without drafts is measured, the yardstick of every draft

    def rate(plan) -> float:
        shares, gain, positions = plan
        seconds = cost.estimate(n_active + sum(shares.values()))
        per_position = (draft_cost.estimate(1) if draft_cost is not None else None) or 0.0
        return (n_active + gain) / (seconds + positions * per_position)

    best = max(plans, key=rate)  # max keeps the first of equals: no draft unless it is expected to pay
    if not equal_lengths:
        # A probe drafts where only its acceptance held it back: the draft, wholly accepted, would make the step
        # PROBE_GAIN times as fast. The margin keeps a draft as dear as it would be worth at best from probing
        # on a noisy reading (a one-token call measured slow once made a target drafting for itself probe).
        for seq in sorted(probes & wanted.keys()):
            shares, gain, positions = best
            length = min(wanted[seq], room - sum(shares.values()))
            if shares[seq] or length <= 0:
                continue
            if rate(({**shares, seq: length}, gain + length, max(positions, length))) > PROBE_GAIN * rate(best):
                best = ({**shares, seq: length}, gain + sum(worth[seq][:length]), max(positions, length))
    return best[0]


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens a and b share. A draft context compares what its KV holds with a sequence's
    history every step, so the usual case (one extends the other) is a single C-level slice comparison and the
    rest a binary search over slice comparisons."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n - 1  # a[:lo] == b[:lo] holds; a[:hi + 1] != b[:hi + 1] holds
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def catch_up_shares(needs: dict[int, int], budget: int) -> dict[int, int]:
    """Tokens each sequence's draft context takes in this step's catch-up call (a new prompt, or the tokens
    verified since the last draft), `budget` in all. The smallest needs first: each sequence that catches up
    fully drafts this step; one that does not drafts a later step and keeps what it got."""
    out = {}
    for seq in sorted(needs, key=lambda s: (needs[s], s)):
        take = min(needs[seq], budget)
        if take <= 0:
            break
        out[seq] = take
        budget -= take
    return out


def draft_choice(logits: np.ndarray) -> tuple[int, float]:
    """The draft model's token (its argmax: a point mass, see the module's docstring) and its probability."""
    token = int(np.argmax(logits))
    peak = float(logits[token])
    return token, float(1.0 / np.exp(logits.astype(np.float64) - peak).sum())


@dataclass(frozen=True)
class Vocabulary:
    """What must match for a draft model's tokens to mean the target's (llama.cpp's speculative example checks
    the same): the tokenizer's type, its BOS/EOS use, and every token's text."""
    kind: int
    add_bos: bool
    bos: int
    add_eos: bool
    eos: int
    texts: tuple[bytes, ...]


def vocabulary_difference(target: Vocabulary, draft: Vocabulary) -> str | None:
    """Why the draft cannot draft for the target (None: it can)."""
    if draft.kind != target.kind:
        return f"its tokenizer is of another type ({draft.kind}, the target's {target.kind})"
    if (draft.add_bos, draft.bos) != (target.add_bos, target.bos) or (draft.add_eos, draft.eos) != \
            (target.add_eos, target.eos):
        return "it starts or ends sequences with other tokens"
    if len(draft.texts) != len(target.texts):
        return f"its vocabulary has {len(draft.texts)} tokens, the target's {len(target.texts)}"
    for i, (mine, theirs) in enumerate(zip(draft.texts, target.texts)):
        if mine != theirs:
            return f"token {i} is {mine!r} there and {theirs!r} in the target"
    return None
