"""Speculation's part of each step, apart from the loop that carries the step out: how long each decoding
sequence's draft is (the length it has earned, its room, and share_drafts' price of the step's calls), who drafts
(the n-gram index each sequence keeps, or the draft model), and what the calls and their verification teach (the
cost of a decode call, the acceptance past a draft's first token). No llama.cpp here but the draft model it is
given; tested alone with fake sequences (tests/test_drafting.py)."""

from __future__ import annotations

import time

from host_runtime.engine.speculation import AcceptanceCurve, CallCost, SpeculationConfig, share_drafts


class StepDrafter:
    def __init__(self, config: SpeculationConfig, *, step_room: int, batch_invariant: bool, n_ctx_per_seq: int,
                 draft_model=None, max_draft: int | None = None):
        """step_room: the decode tokens a call holds (with mixed batches the prompt budget takes the rest);
        draft_model: draft_model.DraftModel, for config.kind "draft"; max_draft: the longest draft whose rows,
        verified in one call with the sequence's token, compute as that token alone does (None: any; 0: none;
        placement/matmul_rows.RowBounds.max_draft)."""
        if config.enabled and config.kind == "draft" and draft_model is None:
            raise ValueError("speculation with a draft model needs the DraftModel (drafter)")
        self.config = config
        self.draft_model = draft_model
        self.step_tokens = min(config.step_tokens, step_room)
        self.batch_invariant = batch_invariant
        self.n_ctx_per_seq = n_ctx_per_seq
        self.max_draft = max_draft
        # What decode calls cost here, and what a draft model's drafting costs per position drafted: drafts go out
        # only where they are expected to raise the step's tokens per second (share_drafts).
        self.call_cost = CallCost() if config.enabled and config.cost_aware else None
        self.draft_cost = CallCost() if self.call_cost is not None and draft_model is not None else None
        self.acceptance_curve = AcceptanceCurve(config.k_max)  # how drafts fare past their first token

    def draft(self, decoding: list) -> None:
        """This step's drafts, set on each decoding sequence (`seq.draft`; empty where none): each asks for up to
        --draft-max tokens (the length it has earned where calls are not priced), within what it may still
        generate and its context; share_drafts gives the step's spare tokens to those expected to yield most, as
        far as the measured cost of calls says they pay."""
        wanted, acceptance = {}, {}
        for seq in decoding:
            if not seq.speculating:
                continue
            room = min(seq.request.max_tokens - seq.generated - 1, self.n_ctx_per_seq - seq.n_past - 2)
            if self.max_draft is not None:
                room = min(room, self.max_draft)
            k = min(seq.draft_length.next_k() if self.call_cost is None else self.config.k_max, room)
            if k > 0:
                wanted[seq.seq_id] = k
                acceptance[seq.seq_id] = seq.draft_length.acceptance
        probes = {seq.seq_id for seq in decoding if seq.seq_id in wanted and seq.draft_length.probe_due()}
        shares = share_drafts(wanted, acceptance, len(decoding), self.step_tokens, self.call_cost,
                              equal_lengths=self.batch_invariant and len(decoding) > 1,
                              draft_cost=self.draft_cost, probes=probes,
                              continuation=self.acceptance_curve.chances() if wanted else None)
        for seq in decoding:
            if seq.seq_id in wanted and not shares.get(seq.seq_id):
                seq.draft_length.declined()
        drafts = self._drafts(decoding, shares)
        if self.batch_invariant and len(decoding) > 1:
            # A KV stream per sequence: llama.cpp splits a call whose sequences carry unequal token counts into
            # equal-count pieces, a weight pass each. So drafts go out only when every decoding sequence has
            # one, cut to one length: one call. (Measured at c=4 on a code edit, letting the sequences without
            # a draft take a second call cost 0.88x the tok/s of no speculation.)
            lengths = [len(drafts.get(seq.seq_id, ())) for seq in decoding]
            drafts = {s: d[:min(lengths)] for s, d in drafts.items()} if min(lengths) > 0 else {}
        for seq in decoding:  # every one: a sequence with nothing drafted now drops last step's draft
            seq.draft = drafts.get(seq.seq_id, [])

    def _drafts(self, decoding: list, shares: dict[int, int]) -> dict[int, list[int]]:
        if self.draft_model is None:
            return {seq.seq_id: seq.ngrams.draft(shares[seq.seq_id]) for seq in decoding if shares.get(seq.seq_id)}
        started = time.monotonic()
        drafts = self.draft_model.draft({seq.seq_id: (seq.history, shares[seq.seq_id])
                                         for seq in decoding if shares.get(seq.seq_id)})
        positions = max((len(d) for d in drafts.values()), default=0)
        if positions and self.draft_cost is not None:  # per position, its catch-up call shared among them
            self.draft_cost.observe(1, (time.monotonic() - started) / positions)
        return drafts

    def decode_call_took(self, n_tokens: int, seconds: float) -> None:
        """A decode call's own cost (no prompt chunk in it): the price share_drafts weighs drafts by."""
        if self.call_cost is not None:
            self.call_cost.observe(n_tokens, seconds)

    def verified(self, seq, drafted: int, accepted: int) -> None:
        """How a sequence's draft fared: its own earned length, and the step's acceptance curve."""
        seq.draft_length.record(drafted, accepted)
        self.acceptance_curve.record(drafted, accepted)
