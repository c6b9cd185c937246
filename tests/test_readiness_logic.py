"""The readiness verdict (pure): slow is not wedged; wedged is no decode progress past a measured bound."""

from host_runtime.engine.progress import DecodeProgress, ProgressSnapshot
from host_runtime.engine.readiness import CanaryRecord, Verdict, WedgePolicy, judge, unanswered

POLICY = WedgePolicy(floor_s=30.0, multiple=10.0)


def snap(**kw) -> ProgressSnapshot:
    base = dict(calls=10, tokens=100, since_last_call_s=0.5, pending_for_s=None, in_call_s=None, in_call_tokens=0,
                slowest_call_s=0.2, last_call_s=0.1, s_per_token=0.01)
    return ProgressSnapshot(**{**base, **kw})


def test_loading_says_where_it_is_and_is_not_ready():
    v = judge("loading", "loading: loading weights 42% of 1.20 GiB", None, CanaryRecord(), POLICY, 0.42)
    assert (v.ready, v.state, v.load_progress) == (False, "loading", 0.42) and "42%" in v.reason
    assert judge("failed", "not a GGUF", None, CanaryRecord(), POLICY).state == "failed"


def test_not_ready_until_the_first_canary_passes_however_long_it_takes():
    slow = snap(pending_for_s=25.0, since_last_call_s=16.0, slowest_call_s=16.0, last_call_s=16.0)
    v = judge("ready", "", slow, CanaryRecord(running_for_s=40.0, count=1), POLICY)
    assert (v.ready, v.state) == (False, "starting") and "first canary has run 40 s" in v.reason
    v = judge("ready", "", slow, CanaryRecord(passed_ago_s=0.1, last_seconds=41.0, count=1), POLICY)
    assert (v.ready, v.state, v.canary_s) == (True, "ready", 41.0)


def test_a_slow_box_with_steps_completing_is_busy_and_ready():
    v = judge("ready", "", snap(pending_for_s=300.0, since_last_call_s=14.0, slowest_call_s=16.0, last_call_s=14.0),
              CanaryRecord(running_for_s=60.0, passed_ago_s=90.0, count=3), POLICY)
    assert (v.ready, v.state) == (True, "busy") and v.bound_s == 160.0 and "last step 14 s" in v.reason


def test_wedged_only_past_the_bound_derived_from_measured_calls():
    canary = CanaryRecord(running_for_s=50.0, passed_ago_s=100.0, count=2)
    # Fast calls: the floor rules. 29 s without progress is not wedged; 31 s is.
    assert judge("ready", "", snap(pending_for_s=29.0, since_last_call_s=29.0), canary, POLICY).state == "busy"
    v = judge("ready", "", snap(pending_for_s=31.0, since_last_call_s=31.0), canary, POLICY)
    assert (v.ready, v.state, v.bound_s) == (False, "wedged", 30.0) and "no decode completed for 31 s" in v.reason
    # Slow calls (16 s each): 10x the slowest.
    slow = dict(slowest_call_s=16.0, last_call_s=16.0)
    assert judge("ready", "", snap(pending_for_s=150.0, since_last_call_s=150.0, **slow), canary, POLICY).ready
    assert judge("ready", "", snap(pending_for_s=170.0, since_last_call_s=170.0, **slow), canary, POLICY).state == "wedged"


def test_a_big_prompt_call_gets_a_bound_scaled_to_its_tokens():
    # Decode calls of 0.2 s, but a 512-token prompt call in flight at 0.05 s per prompt token: 25.6 s expected.
    s = snap(pending_for_s=200.0, since_last_call_s=200.0, in_call_s=200.0, in_call_tokens=512, s_per_token=0.05)
    assert POLICY.bound_s(s) == 256.0
    assert judge("ready", "", s, CanaryRecord(passed_ago_s=1.0), POLICY).ready


def test_idle_time_is_not_a_stall():
    s = snap(pending_for_s=None, since_last_call_s=3600.0)
    assert s.stalled_s() == 0.0
    assert judge("ready", "", s, CanaryRecord(passed_ago_s=3600.0), POLICY).ready
    # Work that arrived 2 s ago after an hour idle has stalled 2 s, not an hour.
    assert snap(pending_for_s=2.0, since_last_call_s=3600.0).stalled_s() == 2.0


def test_a_failed_canary_is_unhealthy_until_one_passes():
    v = judge("ready", "", snap(), CanaryRecord(passed_ago_s=20.0, failure="llama_decode returned -3"), POLICY)
    assert (v.ready, v.state) == (False, "unhealthy") and "llama_decode returned -3" in v.reason


def test_an_engine_that_does_not_answer_is_wedged_after_its_last_bound():
    last = Verdict(True, "ready", "ready", bound_s=12.0)
    assert unanswered(last, 5.0, POLICY).state == "unreachable"
    assert unanswered(last, 13.0, POLICY).state == "wedged"
    assert unanswered(None, 1000.0, POLICY).state == "unreachable"  # never answered: down, not wedged
    assert unanswered(Verdict(False, "loading", "loading"), 1000.0, POLICY).state == "unreachable"


def test_the_wire_form_round_trips():
    v = judge("ready", "", snap(), CanaryRecord(passed_ago_s=1.0, last_seconds=0.3, count=4), POLICY)
    assert Verdict.from_wire(v.to_wire()) == v


def test_progress_tracks_calls_and_pending_work():
    now = [100.0]
    p = DecodeProgress(clock=lambda: now[0])
    p.pending(True)
    p.call_started(128)
    now[0] += 6.5
    assert p.snapshot().in_call_s == 6.5 and p.snapshot().in_call_tokens == 128
    assert p.call_ended() == 6.5
    p.call_started(1)
    now[0] += 0.5
    p.call_ended()
    now[0] += 2.0
    s = p.snapshot()
    assert (s.calls, s.tokens, s.slowest_call_s, s.last_call_s, s.s_per_token) == (2, 129, 6.5, 0.5, 6.5 / 128)
    assert s.since_last_call_s == 2.0 and s.stalled_s() == 2.0
    p.pending(False)
    assert p.snapshot().stalled_s() == 0.0


def test_a_watchers_deadline_follows_progress_not_a_fixed_wait():
    from host_runtime.engine.readiness import ReadyDeadline

    now = [0.0]
    watch = ReadyDeadline(quiet_s=300.0, cap_s=3600.0, clock=lambda: now[0])
    watch.observe(None)  # nothing answers yet (the box boots)
    for step in range(1, 20):  # a slow load: progress moves every 100 s for half an hour
        now[0] += 100.0
        watch.observe({"state": "loading", "load_progress": step / 20})
        assert watch.failed() is None
    now[0] += 250.0
    assert watch.failed() is None
    now[0] += 60.0
    assert "no sign of progress for 310 s" in watch.failed()
    # An engine that reports a long wedge bound gets twice that before the watcher gives up.
    watch.observe({"state": "starting", "calls": 3, "bound_s": 400.0})
    now[0] += 700.0
    assert watch.failed() is None
    now[0] += 200.0
    assert "no sign of progress" in watch.failed()
    watch.observe({"state": "wedged", "reason": "wedged: no decode completed for 41 s"})
    assert watch.failed().startswith("the engine is wedged")


def test_a_watcher_gives_up_at_its_cap_even_with_progress():
    from host_runtime.engine.readiness import ReadyDeadline

    now = [0.0]
    watch = ReadyDeadline(quiet_s=300.0, cap_s=1000.0, clock=lambda: now[0])
    for calls in range(12):
        now[0] += 100.0
        watch.observe({"state": "starting", "calls": calls})
    assert watch.failed().startswith("not ready within 1000 s")
