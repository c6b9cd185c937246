"""The engine's CPU threads: the count that decodes fastest now, found by trying (engine/cpu_share.py). Pure,
fed made-up call timings: per token, and the share of threads x wall time the process's CPU time was."""

from __future__ import annotations

from host_runtime.engine.cpu_share import STRAYS, TRY_FIRST_S, TRY_MAX_S, WINDOW, ThreadShare as _ThreadShare


def ThreadShare(most: int) -> _ThreadShare:
    return _ThreadShare(most, rng=lambda: 0.5)  # no jitter: the waits as set


def feed(share: _ThreadShare, now: float, calls: int, per_token_s: float, cpu_share: float, tokens: int = 1
         ) -> list[int]:
    """`calls` calls of `tokens` tokens taking per_token_s each, at cpu_share of their threads; what it answered."""
    answers = []
    for i in range(calls):
        wall = per_token_s * tokens
        changed = share.observe(wall, wall * cpu_share * share.threads, tokens, now + i * wall)
        if changed is not None:
            answers.append(changed)
    return answers


def test_threads_that_get_their_cores_stay():
    share = ThreadShare(2)
    assert feed(share, 0.0, 20 * WINDOW, 0.010, cpu_share=0.99) == [] and share.threads == 2


def test_a_busy_neighbour_sends_it_down_to_the_count_that_is_faster():
    share = ThreadShare(2)
    assert feed(share, 0.0, WINDOW, 0.028, cpu_share=0.6) == [1]  # 2 threads, one core shared: try 1
    assert feed(share, 0.3, WINDOW, 0.013, cpu_share=1.0) == [] and share.threads == 1  # faster: kept


def test_a_trial_that_is_not_faster_is_undone_and_the_next_one_waits_twice_as_long():
    """The server's own worker takes a little of the box: the share says contended, but 2 threads stay faster."""
    share = ThreadShare(2)
    assert feed(share, 0.0, WINDOW, 0.010, cpu_share=0.8) == [1]
    assert feed(share, 0.1, WINDOW, 0.012, cpu_share=1.0) == [2]  # slower at 1: back to 2
    assert feed(share, 0.3, WINDOW, 0.010, cpu_share=0.8) == []  # the next trial waits 2 x 2 s
    assert feed(share, 0.3 + 2 * TRY_FIRST_S, WINDOW, 0.010, cpu_share=0.8) == [1]


def test_a_thread_more_is_tried_later_and_a_collapsed_call_ends_the_trial_at_once():
    share = ThreadShare(2)
    feed(share, 0.0, WINDOW, 0.028, cpu_share=0.6)
    feed(share, 0.3, WINDOW, 0.013, cpu_share=1.0)
    assert share.threads == 1
    assert feed(share, 0.3 + TRY_FIRST_S + 0.1, WINDOW, 0.013, cpu_share=1.0) == [2]  # the neighbour may be gone
    assert feed(share, 2.6, 1, 0.050, cpu_share=0.5) == [1]  # one collapsed call: back at once
    # the neighbour has gone by the next trial (4 s on): 2 threads are faster, and stay
    assert feed(share, 2.6 + 2 * TRY_FIRST_S + 0.1, WINDOW, 0.013, cpu_share=1.0) == [2]
    assert feed(share, 7.0, 20 * WINDOW, 0.009, cpu_share=0.99) == [] and share.threads == 2


def test_calls_of_another_size_are_not_compared():
    share = ThreadShare(2)
    feed(share, 0.0, WINDOW, 0.028, cpu_share=0.6)  # a trial of 1 thread, judged on one-token calls
    assert feed(share, 0.3, 3 * WINDOW, 0.002, cpu_share=1.0, tokens=128) == []  # prompt chunks: far cheaper per
    assert share.threads == 1 and share.trying                                   # token, not the trial's measure
    assert feed(share, 0.5, WINDOW, 0.013, cpu_share=1.0) == [] and not share.trying


def test_failed_trials_are_spaced_out_to_a_bound_and_calls_too_short_to_time_are_ignored():
    share = ThreadShare(2)
    assert feed(share, 0.0, 10 * WINDOW, 0.0005, cpu_share=0.3) == []  # 0.5 ms calls: timer noise
    t, starts = 0.0, []
    for _ in range(9):
        while share.threads == 2:
            t += 0.05
            feed(share, t, 1, 0.010, cpu_share=0.8)
        starts.append(t)
        feed(share, t, WINDOW, 0.012, cpu_share=1.0)  # 1 thread slower each time: undone
        assert share.threads == 2
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    assert gaps[1] > 1.8 * gaps[0] and max(gaps) <= TRY_MAX_S + 1


def test_waits_are_drawn_around_their_value():
    waits = set()
    for r in (0.0, 0.5, 1.0):
        share = _ThreadShare(2, rng=lambda r=r: r)
        feed(share, 0.0, WINDOW, 0.010, cpu_share=0.8)
        feed(share, 0.1, WINDOW, 0.012, cpu_share=1.0)
        waits.add(round(share._next_at[-1] - (0.1 + 7 * 0.012), 2))
    assert waits == {3.0, 4.0, 5.0}


def test_a_trial_whose_kind_of_call_stops_coming_ends_undecided_and_a_change_of_traffic_starts_a_new_window():
    share = ThreadShare(2)
    # a warm-up's prompt chunks look contended: a trial of 1 thread, judged on prompt-sized calls
    assert feed(share, 0.0, WINDOW, 0.0004, cpu_share=0.7, tokens=128) == [1]
    # then only one-token calls come: after STRAYS of them the trial ends, back to 2, the wait not doubled
    assert feed(share, 0.5, STRAYS, 0.010, cpu_share=1.0) == [2]
    assert not share.trying and share._wait_s[-1] == TRY_FIRST_S
    # outside a trial, calls of a new size simply start a new window: they are judged
    share = ThreadShare(2)
    feed(share, 0.0, 3, 0.0004, cpu_share=0.99, tokens=128)
    assert feed(share, 0.1, WINDOW, 0.028, cpu_share=0.6) == [1]
