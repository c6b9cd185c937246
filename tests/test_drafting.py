"""Speculation's part of a step (engine/drafting.py), alone: fake sequences, an n-gram index or a fake draft model,
no engine and no llama.cpp."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from host_runtime.engine.drafting import StepDrafter
from host_runtime.engine.speculation import DraftLength, NgramIndex, SpeculationConfig

UNPRICED = SpeculationConfig(enabled=True, kind="ngram", k_max=6, cost_aware=False)


@dataclass
class Request:
    max_tokens: int = 100


@dataclass
class Seq:
    seq_id: int
    tokens: list[int]
    request: Request = field(default_factory=Request)
    generated: int = 0
    speculating: bool = True
    draft: list[int] = field(default_factory=list)

    def __post_init__(self):
        self.n_past = len(self.tokens)
        self.ngrams = NgramIndex(self.tokens)
        self.history = list(self.tokens)
        self.draft_length = DraftLength(k_max=6)


REPEATING = [1, 2, 3, 4, 5, 6, 7, 8, 1, 2]  # "1 2" was followed by 3 4 5 6 7 8: a draft of those
NOVEL = [11, 12, 13, 14, 15]  # no n-gram seen twice: nothing to draft


def _drafter(config=UNPRICED, **kw) -> StepDrafter:
    return StepDrafter(config, step_room=kw.pop("step_room", 512), batch_invariant=kw.pop("batch_invariant", True),
                       n_ctx_per_seq=kw.pop("n_ctx_per_seq", 4096), **kw)


def test_a_lone_sequence_drafts_what_followed_its_last_tokens_earlier():
    seq = Seq(0, REPEATING)
    _drafter().draft([seq])
    assert seq.draft and seq.draft == [3, 4, 5, 6, 7, 8][:len(seq.draft)]


def test_batch_invariant_drafts_go_out_for_every_decoding_sequence_or_none():
    """A KV stream per sequence: unequal token counts split the call into a weight pass each, so drafts go out
    only when each decoding sequence has one, cut to one length."""
    drafting, novel = Seq(0, REPEATING), Seq(1, NOVEL)
    _drafter().draft([drafting, novel])
    assert drafting.draft == [] and novel.draft == []
    other = Seq(1, [9, 3, 4, 9, 3])  # "9 3" was followed by 4 9 3: a three-token draft
    _drafter().draft([drafting, other])
    assert (drafting.draft, other.draft) == ([3, 4, 5], [4, 9, 3])
    # With mixed batches (one shared KV buffer) each keeps its own length
    _drafter(batch_invariant=False).draft([drafting, other])
    assert len(drafting.draft) > 3 and other.draft == [4, 9, 3]


def test_no_draft_past_what_a_sequence_may_still_generate_or_hold():
    last_token = Seq(0, REPEATING, request=Request(max_tokens=1))
    _drafter().draft([last_token])
    assert last_token.draft == []
    full = Seq(0, REPEATING)
    _drafter(n_ctx_per_seq=len(REPEATING) + 3).draft([full])  # room for one more token after the pending one
    assert full.draft == [3]
    opted_out = Seq(0, REPEATING, speculating=False)
    opted_out.draft = [7]  # last step's: dropped
    _drafter().draft([opted_out])
    assert opted_out.draft == []


def test_no_draft_longer_than_the_rows_a_call_may_hold_beside_its_token():
    # placement/matmul_rows.RowBounds.decode_rows: K-quants compute 8 rows or more otherwise, so a draft verified
    # beside its token keeps to 6; with F16 matrices none goes out.
    capped = Seq(0, REPEATING)
    _drafter(max_draft=2).draft([capped])
    assert capped.draft == [3, 4]
    none = Seq(0, REPEATING)
    _drafter(max_draft=0).draft([none])
    assert none.draft == []


def test_a_draft_model_drafts_and_its_cost_is_measured_per_position():
    class DraftModel:
        asked: dict = {}

        def draft(self, wanted):
            self.asked = wanted
            return {seq_id: [42] * k for seq_id, (_, k) in wanted.items()}

    model = DraftModel()
    config = SpeculationConfig(enabled=True, kind="draft", k_max=6)
    drafter = _drafter(config, draft_model=model)
    for _ in range(8):  # a call of 16 tokens costs hardly more than one of 1: drafts pay
        drafter.decode_call_took(1, 0.050)
        drafter.decode_call_took(16, 0.052)
    seq = Seq(0, NOVEL)
    drafter.draft([seq])
    assert seq.draft and set(seq.draft) == {42} and model.asked[0][0] == NOVEL
    assert drafter.draft_cost is not None and drafter.draft_cost.estimate(1) is not None
    with pytest.raises(ValueError, match="needs the DraftModel"):
        _drafter(config)


def test_what_verification_teaches_is_kept_for_the_next_steps():
    drafter = _drafter()
    seq = Seq(0, REPEATING)
    before = (seq.draft_length.acceptance, drafter.acceptance_curve.chances())
    for _ in range(4):
        drafter.verified(seq, drafted=6, accepted=0)
    assert (seq.draft_length.acceptance, drafter.acceptance_curve.chances()) != before
    assert seq.draft_length.next_k() < 6  # a sequence whose drafts are all rejected earns shorter ones
