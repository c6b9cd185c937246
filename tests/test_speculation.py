"""Speculative decoding's pure parts: lookup drafts, the earned draft length, the step's share for drafts, and
verification that changes nothing in the output (the same tokens at temperature 0, the same distribution above)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from host_runtime.engine.speculation import (AcceptanceCurve, CallCost, DraftLength, NgramIndex, Vocabulary,
                                             catch_up_shares, common_prefix_len, draft_choice, share_drafts,
                                             vocabulary_difference)
from tests.speculation_reference import accept_greedy, accept_sampled, lookup_draft


def test_a_lookup_draft_continues_the_latest_earlier_occurrence_longest_match_first():
    prompt = [10, 11, 12, 13, 14, 20]
    assert lookup_draft(prompt + [11, 12], k=3) == [13, 14, 20]
    # Two earlier occurrences of [5]: the latest wins; a longer match beats a later shorter one.
    assert lookup_draft([5, 1, 5, 2, 9, 5], n_max=1, k=1) == [2]
    assert lookup_draft([7, 8, 1, 3, 8, 2, 7, 8], k=1) == [1]
    assert lookup_draft([1, 2, 3, 4], k=4) == [] and lookup_draft([], k=4) == [] and lookup_draft([1, 1], k=0) == []
    assert lookup_draft([4, 4, 4], k=5) == [4]  # a run repeats itself, bounded by what has been seen


def test_the_incremental_index_drafts_what_the_search_finds():
    rng = random.Random(11)
    for _ in range(300):
        vocab = rng.choice([2, 3, 6, 50])
        tokens = [rng.randrange(vocab) for _ in range(rng.randrange(0, 60))]
        cut = rng.randrange(0, len(tokens) + 1)
        index = NgramIndex(tokens[:cut], n_max=4, n_min=2)
        index.extend(tokens[cut:])  # a prompt, then generated tokens one call at a time
        for k in (1, 5):
            assert index.draft(k) == lookup_draft(tokens, n_max=4, n_min=2, k=k), (tokens, k)
    assert NgramIndex([1, 2, 3, 1, 2], n_min=2).draft(4) == [3, 1, 2]
    assert NgramIndex([1, 2, 3, 9, 2], n_min=2).draft(4) == []  # a one-token match is not enough


def test_the_draft_length_grows_with_acceptance_shrinks_with_rejection_and_pauses_when_useless():
    d = DraftLength(k_max=16, k=4)
    d.record(4, 4)
    assert d.next_k() == 8
    d.record(8, 8)
    d.record(16, 16)
    assert d.next_k() == 16
    d.record(16, 2)
    assert d.next_k() == 3
    for _ in range(20):
        d.record(d.k, 0)
    assert d.acceptance < d.floor
    ks = [d.next_k() for _ in range(32)]
    assert ks.count(1) == 2 and set(ks) == {0, 1}  # paused, with a one-token try every 16 steps


def test_a_sequences_acceptance_is_the_chance_its_next_drafts_first_token_is_kept():
    d = DraftLength()
    assert d.acceptance == 0.5  # the prior
    d.record(12, 5)  # the first token kept (five were)
    assert d.acceptance == pytest.approx(0.6)
    d.record(4, 0)
    assert d.acceptance == pytest.approx(0.48)


def test_the_curve_learns_each_later_positions_chance_from_drafts_that_reached_it():
    curve = AcceptanceCurve(k_max=4, prior=0.8, weight=2.0, keep=1.0)
    assert curve.chances() == [0.8, 0.8, 0.8]  # positions 2 to 4, before any draft
    curve.record(4, 4)  # every position tried and kept
    curve.record(4, 1)  # the 2nd tried and refused; the 3rd and 4th never tried
    curve.record(1, 0)  # nothing past the first: nothing learned here
    assert curve.chances() == pytest.approx([(1 + 1.6) / (2 + 2), (1 + 1.6) / (1 + 2), (1 + 1.6) / (1 + 2)])
    # Priced with the curve, a draft that starts right runs on: a long draft yields more than one chance for
    # every position would say.
    reading = learned(lambda n: 0.010 + 0.002 * n)
    assert share_drafts({1: 12}, {1: 0.77}, n_active=1, step_tokens=16, cost=reading) == {1: 4}
    assert share_drafts({1: 12}, {1: 0.77}, n_active=1, step_tokens=16, cost=reading,
                        continuation=[0.9, 0.9, 0.9] + [0.97] * 8) == {1: 12}


def test_a_declined_sequence_drifts_back_toward_its_prior_and_so_drafts_again_where_that_pays():
    d = DraftLength()
    for _ in range(3):
        d.record(1, 0)  # its first drafts failed (the prose before a code edit's file)
    assert d.acceptance < 0.3
    cost = CallCost()
    cost.observe(1, 0.010)
    cost.observe(2, 0.0135)  # a drafted token pays where it yields more than 0.35 tokens
    declined = 0
    while share_drafts({0: 1}, {0: d.acceptance}, n_active=1, step_tokens=16, cost=cost) == {0: 0}:
        d.declined()
        declined += 1
        assert declined < 64, "it never drafts again"
    assert 0.35 <= d.acceptance < 0.5 and declined > 1  # a few steps back, not all the way at once
    # Staleness works both ways: a high acceptance the cost rule keeps declining also returns toward the prior.
    high = DraftLength()
    for _ in range(3):
        high.record(12, 12)
    assert high.acceptance > 0.7
    for _ in range(32):
        high.declined()
    assert 0.5 < high.acceptance < 0.7
    assert high.probe_due()  # and, declined 16 steps in a row, it may probe
    high.record(1, 1)
    assert not high.probe_due()


def test_drafts_share_what_is_left_of_a_step_best_acceptance_first():
    wanted = {1: 8, 2: 8, 3: 8}
    # The i-th drafted token yields acceptance**i: the 4th of sequence 3 (0.06) comes after the 1st of sequence 1.
    assert share_drafts(wanted, {1: 0.2, 2: 0.9, 3: 0.5}, n_active=3, step_tokens=16) == {2: 8, 3: 4, 1: 1}
    assert share_drafts(wanted, {}, n_active=16, step_tokens=16) == {1: 0, 2: 0, 3: 0}  # compute-bound: none


def test_the_common_prefix_of_two_histories_is_found_wherever_they_part():
    rng = random.Random(3)
    for _ in range(500):
        a = [rng.randrange(3) for _ in range(rng.randrange(0, 40))]
        b = list(a[:rng.randrange(0, len(a) + 1)]) + [rng.randrange(3) for _ in range(rng.randrange(0, 10))]
        expected = 0
        while expected < min(len(a), len(b)) and a[expected] == b[expected]:
            expected += 1
        assert common_prefix_len(a, b) == expected == common_prefix_len(b, a), (a, b)


def test_draft_catch_up_goes_to_the_smallest_needs_first_within_the_call():
    # A sequence one token behind (the usual step) always fits before a new prompt's hundreds of tokens.
    assert catch_up_shares({1: 300, 2: 1, 3: 2}, budget=64) == {2: 1, 3: 2, 1: 61}
    assert catch_up_shares({1: 1, 2: 1}, budget=1) == {1: 1}
    assert catch_up_shares({}, budget=8) == {}


def test_the_draft_models_token_is_its_argmax_with_that_tokens_probability():
    logits = np.log(np.array([0.1, 0.6, 0.3], dtype=np.float32)) + 7.0
    token, p = draft_choice(logits)
    assert token == 1 and p == pytest.approx(0.6, abs=1e-6)


def test_a_draft_model_must_share_the_targets_tokens():
    target = Vocabulary(kind=2, add_bos=False, bos=1, add_eos=False, eos=2, texts=(b"<s>", b"</s>", b"a", b"b"))
    assert vocabulary_difference(target, target) is None
    other = dict(kind=2, add_bos=False, bos=1, add_eos=False, eos=2)
    assert vocabulary_difference(target, Vocabulary(**other, texts=(b"<s>", b"</s>", b"a"))) == \
        "its vocabulary has 3 tokens, the target's 4"
    assert vocabulary_difference(target, Vocabulary(**other, texts=(b"<s>", b"</s>", b"a", b"c"))) == \
        "token 3 is b'c' there and b'b' in the target"
    assert "type" in vocabulary_difference(target, Vocabulary(**{**other, "kind": 1}, texts=target.texts))
    assert "starts or ends" in vocabulary_difference(target, Vocabulary(**{**other, "eos": 3}, texts=target.texts))


def test_greedy_verification_gives_exactly_the_one_token_at_a_time_output():
    rng = random.Random(7)

    def model(prefix):  # a deterministic toy target: the argmax after a prefix
        return (sum(prefix) * 31 + len(prefix)) % 5

    for _ in range(300):
        out = [rng.randrange(5) for _ in range(3)]
        reference = list(out)
        for _ in range(12):
            reference.append(model(reference))
        while len(out) < len(reference):
            draft = [rng.randrange(5) if rng.random() < 0.4 else model(out + [])
                     for _ in range(rng.randrange(0, 5))]
            # the target's choices after out + draft[:i], as one batched decode gives them
            target = [model(out + draft[:i]) for i in range(len(draft) + 1)]
            n, nxt = accept_greedy(draft, target)
            out += draft[:n] + [nxt]
        assert out[:len(reference)] == reference
    with pytest.raises(ValueError):
        accept_greedy([1, 2], [1, 2])


@pytest.mark.parametrize("drafter", ["lookup", "model"])
def test_sampled_verification_leaves_the_targets_distribution(drafter):
    """Five tokens: the first output token's frequencies over 40,000 seeded trials match the target's
    distribution (within 0.015; 5 standard errors), whatever the draft was."""
    rng = np.random.default_rng(1234)
    p = np.array([[0.05, 0.30, 0.10, 0.40, 0.15], [0.2, 0.2, 0.2, 0.2, 0.2], [0.1, 0.1, 0.5, 0.2, 0.1]])
    q = np.array([[0.40, 0.10, 0.10, 0.10, 0.30], [0.6, 0.1, 0.1, 0.1, 0.1]])
    counts = np.zeros(5)
    trials = 40_000
    for _ in range(trials):
        if drafter == "lookup":
            draft, qs = [4, 0], None   # a lookup draft proposes the same tokens every time
        else:
            draft = [int(rng.choice(5, p=q[0])), int(rng.choice(5, p=q[1]))]
            qs = q
        n, nxt = accept_sampled(draft, p, rng, qs)
        first = draft[0] if n > 0 else nxt
        counts[first] += 1
    assert np.max(np.abs(counts / trials - p[0])) < 0.015, counts / trials


def test_a_request_opts_out_of_speculation_with_a_boolean_and_anything_else_is_a_400():
    from host_runtime.serving.errors import APIError
    from host_runtime.serving.protocol import parse_chat, parse_completion

    messages = [{"role": "user", "content": "hi"}]
    assert parse_chat({"model": "m", "messages": messages}, "m").request.speculation is True
    assert parse_chat({"model": "m", "messages": messages, "speculation": False}, "m") \
        .request.speculation is False
    assert parse_completion({"model": "m", "prompt": "hi", "speculation": False}, "m") \
        .request.speculation is False
    with pytest.raises(APIError) as exc:
        parse_chat({"model": "m", "messages": messages, "speculation": "no"}, "m")
    assert exc.value.status == 400 and exc.value.param == "speculation"


def test_the_cost_of_a_call_is_learned_per_token_count_and_read_between_and_above_what_was_seen():
    cost = CallCost(weight=0.5)
    assert cost.estimate(1) is None
    cost.observe(1, 0.010)
    cost.observe(5, 0.030)
    cost.observe(5, 0.050)  # moving average: 0.040
    assert cost.estimate(5) == pytest.approx(0.040)
    assert cost.estimate(3) == pytest.approx(0.025)  # between: the line through 1 and 5
    assert cost.estimate(9) == pytest.approx(0.040)  # above: as dear as the largest seen, so it is tried
    cost2 = CallCost()
    cost2.observe(4, 0.02)
    assert cost2.estimate(2) is None  # below everything seen: unknown


def learned(seconds_for) -> CallCost:
    cost = CallCost()
    for n in range(1, 17):
        cost.observe(n, seconds_for(n))
    return cost


def test_drafts_go_out_only_where_the_measured_cost_of_a_call_says_they_pay():
    wanted, good = {1: 8}, {1: 0.8}
    # Bound by reading the weights (a GPU): a token more costs 2% of a call, so a good draft goes out whole.
    reading = learned(lambda n: 0.010 + 0.0002 * n)
    assert share_drafts(wanted, good, n_active=1, step_tokens=16, cost=reading) == {1: 8}
    # Bound by computing them (2 small cores): each token costs a call's worth, so no draft pays.
    computing = learned(lambda n: 0.010 * n)
    assert share_drafts(wanted, good, n_active=1, step_tokens=16, cost=computing) == {1: 0}
    # Between: a fixed part of 5 ms pays for the first tokens of drafts accepted 80% of the time (the third
    # yields 0.51 tokens for its 5 ms: no longer), not for ones accepted 20%.
    between = learned(lambda n: 0.005 + 0.005 * n)
    assert share_drafts(wanted, good, n_active=1, step_tokens=16, cost=between) == {1: 2}
    assert share_drafts(wanted, {1: 0.2}, n_active=1, step_tokens=16, cost=between) == {1: 0}
    # A draft model's call per drafted position is part of the price.
    assert share_drafts(wanted, good, n_active=1, step_tokens=16, cost=reading,
                        draft_cost=learned(lambda n: 0.010)) == {1: 0}  # 10 ms a drafted position
    # Nothing measured yet at this many sequences: the plain call is measured first.
    assert share_drafts(wanted, good, n_active=1, step_tokens=16, cost=CallCost()) == {1: 0}


def test_with_equal_lengths_every_sequence_drafts_the_same_or_none_does():
    reading = learned(lambda n: 0.010 + 0.0002 * n)
    shares = share_drafts({1: 8, 2: 3, 3: 6}, {1: 0.9, 2: 0.9, 3: 0.9}, n_active=3, step_tokens=16, cost=reading,
                          equal_lengths=True)
    assert shares == {1: 3, 2: 3, 3: 3}  # the shortest wanted, within the step's 13 spare tokens
    assert share_drafts({1: 8, 2: 8}, {1: 0.9, 2: 0.9}, n_active=3, step_tokens=16, cost=reading,
                        equal_lengths=True) == {1: 0, 2: 0}  # the third decoding sequence drafts nothing


def test_a_long_declined_sequence_probes_where_a_wholly_accepted_draft_would_pay_and_only_there():
    between = learned(lambda n: 0.005 + 0.005 * n)
    assert share_drafts({1: 4}, {1: 0.2}, n_active=1, step_tokens=16, cost=between) == {1: 0}
    assert share_drafts({1: 4}, {1: 0.2}, n_active=1, step_tokens=16, cost=between, probes={1}) == {1: 4}
    # Each token a call's worth: not even a wholly accepted draft pays, so no probe either.
    computing = learned(lambda n: 0.010 * n)
    assert share_drafts({1: 4}, {1: 0.2}, n_active=1, step_tokens=16, cost=computing, probes={1}) == {1: 0}
    # Nor where a wholly accepted draft would pay, but by less than PROBE_GAIN (5 tokens in 40 ms, one in 9.6: 1.2x).
    slight = learned(lambda n: 0.002 + 0.0076 * n)
    assert share_drafts({1: 4}, {1: 0.2}, n_active=1, step_tokens=16, cost=slight, probes={1}) == {1: 0}
    # One call a step in the invariant layout: a probe would make every sequence draft, so none goes out.
    assert share_drafts({1: 4, 2: 4}, {1: 0.2, 2: 0.2}, n_active=2, step_tokens=16, cost=between,
                        equal_lengths=True, probes={1}) == {1: 0, 2: 0}
