"""The engine's CPU threads follow the cores it gets (engine/cpu_share.py): pure, fed made-up call timings."""

from __future__ import annotations

from host_runtime.engine.cpu_share import FIRST_CALLS_S, PROBE_FIRST_S, PROBE_MAX_S, WINDOW, ThreadShare as _ThreadShare


def ThreadShare(most: int) -> _ThreadShare:
    # no jitter: the waits as set; the first calls judged too (FIRST_CALLS_S is tested apart)
    return _ThreadShare(most, rng=lambda: 0.5, _judge_from=0.0)


def feed(share: ThreadShare, now: float, calls: int, cpu_per_wall: float, wall_s: float = 0.02) -> list[int]:
    """`calls` calls whose CPU time is `cpu_per_wall` x their wall time; the thread counts it answered."""
    answers = []
    for i in range(calls):
        changed = share.observe(wall_s, wall_s * cpu_per_wall, now + i * wall_s)
        if changed is not None:
            answers.append(changed)
    return answers


def test_threads_that_get_their_cores_stay():
    share = ThreadShare(2)
    assert feed(share, 0.0, 10 * WINDOW, cpu_per_wall=1.98) == [] and share.threads == 2


def test_a_neighbour_holding_a_core_takes_one_thread_a_window_down_to_one():
    share = ThreadShare(4)
    # 4 threads getting 2.4 cores (0.6 each), then 3 getting 1.8, ...: one fewer each window, never below 1
    assert feed(share, 0.0, WINDOW, cpu_per_wall=2.4) == [3]
    assert feed(share, 0.2, WINDOW, cpu_per_wall=1.8) == [2]
    assert feed(share, 0.4, WINDOW, cpu_per_wall=1.2) == [1]
    assert feed(share, 0.6, WINDOW, cpu_per_wall=0.6) == [] and share.threads == 1


def test_calls_too_short_to_time_are_not_judged():
    share = ThreadShare(2)
    assert feed(share, 0.0, 10 * WINDOW, cpu_per_wall=0.5, wall_s=0.001) == [] and share.threads == 2


def test_a_thread_is_tried_again_later_and_kept_once_the_neighbour_is_gone():
    share = ThreadShare(2)
    assert feed(share, 0.0, WINDOW, cpu_per_wall=1.0) == [1]  # judged at 0.14 s: the first probe is due 2 s on
    assert feed(share, PROBE_FIRST_S, 1, cpu_per_wall=1.0) == []  # too early
    # still contended when the probe comes: back to one, and the next probe waits twice as long
    assert feed(share, PROBE_FIRST_S + 0.2, 1, cpu_per_wall=1.0) == [2]
    assert feed(share, PROBE_FIRST_S + 0.3, WINDOW, cpu_per_wall=1.0) == [1]  # judged at 2.44 s
    assert feed(share, 2.44 + PROBE_FIRST_S + 0.1, 1, cpu_per_wall=1.0) == []  # the first wait has doubled
    t = 2.44 + 2 * PROBE_FIRST_S + 0.1
    assert feed(share, t, 1, cpu_per_wall=1.0) == [2]
    # the neighbour has gone: the probe's window gets both cores, and 2 threads stay
    assert feed(share, t + 0.1, 10 * WINDOW, cpu_per_wall=1.97) == [] and share.threads == 2


def test_failed_probes_are_spaced_out_to_a_bound():
    share = ThreadShare(2)
    feed(share, 0.0, WINDOW, cpu_per_wall=1.0)
    t, waits = 0.0, []
    for _ in range(10):
        while share.observe(0.02, 0.02, t) is None:  # one thread, its core to itself: wait for the probe
            t += 0.05
        waits.append(t)
        t += 0.02
        feed(share, t, WINDOW, cpu_per_wall=1.0)  # the probe's two threads get one core between them
        t += WINDOW * 0.02
    gaps = [b - a for a, b in zip(waits, waits[1:])]
    assert gaps[1] > 1.8 * gaps[0] and max(gaps) <= PROBE_MAX_S + 1


def test_slow_calls_are_judged_after_a_quarter_second_not_eight_calls():
    share = ThreadShare(2)
    assert feed(share, 0.0, 1, cpu_per_wall=0.6, wall_s=0.2) == []
    assert feed(share, 0.2, 1, cpu_per_wall=0.6, wall_s=0.2) == [1]  # two calls, 0.4 s: judged


def test_a_probe_whose_first_call_gets_half_its_cores_fails_at_once():
    share = ThreadShare(2)
    feed(share, 0.0, WINDOW, cpu_per_wall=1.0)
    assert feed(share, 3.0, 1, cpu_per_wall=1.0) == [2]
    assert feed(share, 3.1, 1, cpu_per_wall=1.0, wall_s=0.7) == [1]  # one collapsed call: back to one thread


def test_probe_waits_are_drawn_around_their_value():
    waits = set()
    for r in (0.0, 0.5, 1.0):
        share = _ThreadShare(2, rng=lambda r=r: r, _judge_from=0.0)
        feed(share, 0.0, WINDOW, cpu_per_wall=1.0)
        waits.add(round(share._next_probe_at - 0.14, 2))
    assert waits == {1.5, 2.0, 2.5}


def test_once_a_probe_shows_the_cores_are_free_small_dips_no_longer_take_a_thread():
    """The server's own worker dips an engine alone under 0.85 now and then; a busy neighbour takes it under 0.75."""
    share = ThreadShare(2)
    assert feed(share, 0.0, WINDOW, cpu_per_wall=1.6) == [1]  # 0.8 of 2 cores: not yet known to be free
    assert feed(share, PROBE_FIRST_S + 0.2, 1, cpu_per_wall=1.0) == [2]
    assert feed(share, PROBE_FIRST_S + 0.3, WINDOW, cpu_per_wall=1.9) == []  # the probe got its cores: settled
    assert feed(share, PROBE_FIRST_S + 1.0, 10 * WINDOW, cpu_per_wall=1.6) == [] and share.threads == 2
    assert feed(share, PROBE_FIRST_S + 5.0, WINDOW, cpu_per_wall=1.3) == [1]  # 0.65: a neighbour


def test_a_probe_call_at_half_its_cores_but_not_slow_waits_for_the_window():
    """An engine alone has some calls at half its cores (a thread woken late); one of them is not a collapse."""
    share = ThreadShare(2)
    feed(share, 0.0, WINDOW, cpu_per_wall=1.0)  # down to one thread, its calls 20 ms
    assert feed(share, 3.0, 1, cpu_per_wall=1.0) == [2]
    assert feed(share, 3.1, 1, cpu_per_wall=1.0, wall_s=0.015) == []  # half the cores, no slower: not judged alone
    assert feed(share, 3.2, WINDOW, cpu_per_wall=1.95, wall_s=0.015) == [] and share.threads == 2  # the window: kept


def test_a_probe_whose_calls_got_faster_is_kept_whatever_its_share():
    share = ThreadShare(2)
    feed(share, 0.0, WINDOW, cpu_per_wall=1.0)  # a window read at half the cores: one thread, its calls 20 ms
    assert feed(share, 0.3, WINDOW, cpu_per_wall=1.0) == []  # one thread's calls, 20 ms each
    assert feed(share, 3.0, 1, cpu_per_wall=1.0) == [2]
    # the probe's calls read 0.8 of 2 cores (under CONTENDED) and take 14 ms: faster than one thread's, so the
    # thread stays, settled (0.8 is above SETTLED)
    assert feed(share, 3.1, 2 * WINDOW, cpu_per_wall=1.6, wall_s=0.014) == [] and share.threads == 2


def test_an_engines_first_calls_are_not_judged():
    share = _ThreadShare(2, rng=lambda: 0.5)
    assert feed(share, 0.0, 10 * WINDOW, cpu_per_wall=1.0) == []  # its warm-up, 1.6 s at half the cores
    assert feed(share, FIRST_CALLS_S, WINDOW, cpu_per_wall=1.0) == [1]  # then judged as ever
