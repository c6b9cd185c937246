"""A fleet's rolling update (pure): one box at a time, never fewer than N-1 boxes serving a model N hold, and a
stop at the first box that does not come back on the target version."""

from __future__ import annotations

from dataclasses import replace

from host_runtime.fleet.capabilities import Capabilities, GovernorView, ModelCapability
from host_runtime.fleet.rollout import DONE, HOLD, START, STOPPED, WAIT, BoxView, Rollout

A, B, C = "https://a:8443", "https://b:8443", "https://c:8443"
OLD, NEW = "2026.12.04", "2026.12.05"


def caps(version: str = OLD, models=("m",), **kw) -> Capabilities:
    base = Capabilities(box="x", version=version, governor=GovernorView("normal", 0),
                        models=tuple(ModelCapability(m, "loaded") for m in models),
                        update_target=OLD, update_phase="blessed")
    return replace(base, **kw)


def fleet(**boxes) -> list[BoxView]:
    return [BoxView(box, c) for box, c in boxes.items()]


def test_boxes_update_one_at_a_time_in_order_each_once_it_is_back_and_blessed():
    r = Rollout(NEW, (A, B, C))
    views = fleet(**{A: caps(), B: caps(), C: caps()})
    step = r.next_step(views, 0)
    assert (step.action, step.box) == (START, A)
    r.started(A, views, 0)
    draining = caps(draining=True, draining_reason=f"update to {NEW} is writing", update_target=NEW,
                    update_phase="writing")
    assert r.next_step(fleet(**{A: draining, B: caps(), C: caps()}), 60) == \
        type(step)(WAIT, A, f"update writing (update to {NEW} is writing)")
    assert r.next_step(fleet(**{A: None, B: caps(), C: caps()}), 120).why == "rebooting (not answering)"
    booted = caps(NEW, update_target=NEW, update_phase="booting")
    assert r.next_step(fleet(**{A: booted, B: caps(), C: caps()}), 180).action == WAIT  # the gate has not passed
    blessed = caps(NEW, update_target=NEW, update_phase="blessed")
    step = r.next_step(fleet(**{A: blessed, B: caps(), C: caps()}), 240)
    assert (step.action, step.box) == (START, B) and r.done == [A]
    r.started(B, fleet(**{A: blessed, B: caps(), C: caps()}), 240)
    r.next_step(fleet(**{A: blessed, B: blessed, C: caps(NEW)}), 300)   # C was already there
    assert r.next_step(fleet(**{A: blessed, B: blessed, C: caps(NEW)}), 301).action == DONE
    assert r.done == [A, B, C]


def test_a_box_is_not_started_while_another_holder_of_its_model_is_down_or_draining():
    r = Rollout(NEW, (A, B, C))
    views = fleet(**{A: caps(models=("m", "solo")), B: caps(models=("m",)), C: caps(models=("other",))})
    r.next_step(views, 0)   # remembers who holds what
    down = fleet(**{A: caps(models=("m", "solo")), B: None, C: caps(models=("other",))})
    step = r.next_step(down, 10)
    assert step.action == HOLD and step.box == A and "m is held by 2 boxes and https://b:8443 is not serving" in step.why
    busy = fleet(**{A: caps(models=("m", "solo")), B: caps(models=("m",), draining=True, draining_reason="x"),
                    C: caps(models=("other",))})
    assert r.next_step(busy, 20).action == HOLD
    # A model only one box holds may go while that box updates: N-1 is none.
    assert r.next_step(views, 30).action == START


def test_the_rollout_stops_at_the_first_box_that_rolls_back_or_does_not_come_back():
    r = Rollout(NEW, (A, B), timeout_s=600)
    views = fleet(**{A: caps(), B: caps()})
    r.next_step(views, 0)
    r.started(A, views, 0)
    rolled_back = caps(OLD, update_target=NEW, update_phase="rolled-back", update_reason="the health gate failed")
    step = r.next_step(fleet(**{A: rolled_back, B: caps()}), 400)
    assert (step.action, step.box) == (STOPPED, A)
    assert step.why == f"its update to {NEW} rolled-back: the health gate failed"
    assert r.next_step(fleet(**{A: rolled_back, B: caps()}), 401).action == STOPPED   # and stays stopped: B untouched

    r = Rollout(NEW, (A, B), timeout_s=600)
    r.next_step(views, 0)
    r.started(A, views, 0)
    assert r.next_step(fleet(**{A: None, B: caps()}), 599).action == WAIT
    step = r.next_step(fleet(**{A: None, B: caps()}), 601)
    assert step.action == STOPPED and step.why == f"not back on {NEW} after 600 s (not answering)"


def test_an_earlier_failed_attempt_at_the_same_version_does_not_stop_a_new_rollout():
    before = caps(OLD, update_target=NEW, update_phase="failed", update_reason="no space")
    r = Rollout(NEW, (A,))
    views = fleet(**{A: before})
    assert r.next_step(views, 0).action == START
    r.started(A, views, 0)
    assert r.next_step(views, 5).action == WAIT   # the same old record: this attempt has not said anything yet
