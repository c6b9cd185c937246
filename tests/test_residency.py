"""Which models stay loaded (pure): LRU unloading within a memory budget, keep-alive, pinning."""

import pytest

from host_runtime.pool.residency import LoadPlan, Resident, expired, load_room, parse_keep_alive, plan_load

GIB = 1 << 30


def r(name, size, used, busy=False, pinned=False, keep=300.0):
    return Resident(name, size * GIB, used, busy, pinned, keep)


def test_a_model_that_fits_loads_without_unloading_anything():
    assert plan_load(2 * GIB, 10 * GIB, [r("a", 4, 1.0)]) == LoadPlan()


def test_room_is_made_from_the_least_recently_used_idle_models():
    residents = [r("old", 3, 1.0), r("newer", 3, 5.0), r("newest", 3, 9.0)]
    assert plan_load(3 * GIB, 10 * GIB, residents).evict == ("old",)
    assert plan_load(6 * GIB, 10 * GIB, residents).evict == ("old", "newer")


def test_busy_and_pinned_models_stay_and_the_load_waits_when_only_they_hold_the_room():
    residents = [r("busy", 4, 1.0, busy=True), r("pinned", 4, 2.0, pinned=True), r("idle", 1, 9.0)]
    assert plan_load(2 * GIB, 10 * GIB, residents).evict == ("idle",)
    plan = plan_load(5 * GIB, 10 * GIB, residents)
    assert plan.wait and not plan.fits and plan.evict == ()
    # Room that only pinned models hold never comes: refused, not waited for.
    plan = plan_load(7 * GIB, 10 * GIB, [r("pinned", 4, 2.0, pinned=True)])
    assert plan.pinned_hold == 4 * GIB and not plan.wait and not plan.fits


def test_a_model_larger_than_the_whole_budget_says_by_how_much():
    plan = plan_load(12 * GIB, 10 * GIB, [])
    assert plan.shortfall == 2 * GIB and not plan.fits


def test_each_plan_as_the_capability_map_says_it():
    residents = [r("busy", 4, 1.0, busy=True), r("pinned", 4, 2.0, pinned=True), r("idle", 1, 9.0)]
    assert [load_room(plan_load(n * GIB, 10 * GIB, residents)) for n in (1, 2, 5, 7, 11)] == [
        "free", "unloads", "waits", "never", "never"]


def test_keep_alive_unloads_idle_models_only():
    residents = [r("stale", 1, 0.0), r("fresh", 1, 250.0), r("busy", 1, 0.0, busy=True),
                 r("pinned", 1, 0.0, pinned=True), r("forever", 1, 0.0, keep=None)]
    assert expired(residents, 300.0) == ["stale"]


@pytest.mark.parametrize("value,seconds", [(30, 30.0), (0, 0.0), (-1, None), ("5m", 300.0), ("1h", 3600.0),
                                           ("45s", 45.0), ("-1m", None), ("10", 10.0)])
def test_keep_alive_forms(value, seconds):
    assert parse_keep_alive(value) == seconds


@pytest.mark.parametrize("value", ["soon", True, [], "5x"])
def test_bad_keep_alive_is_refused(value):
    with pytest.raises(ValueError):
        parse_keep_alive(value)


def test_the_pools_metrics_and_the_consoles_lines_from_them():
    from host_runtime.box_status.rows import Serving, Source, models_from_metrics
    from host_runtime.console.status_text import model_lines
    from host_runtime.models.provisioned import PullStatus
    from host_runtime.pool.metrics import pool_text

    pull = PullStatus("big", "http://nas/big.gguf", "ab" * 32, state="pulling", done_bytes=3 << 30,
                      total_bytes=12 << 30, rate_bytes_s=100 << 20)
    text = pool_text({"memory": {"small": {"planned": 200 << 20, "resident": 150 << 20}}, "budget": 1 << 30,
                      "loads": {"small": 2}, "unloads": [("small", "room", 1)], "pull": pull})
    assert 'everycycle_model_unloads_total{model="small",reason="room"} 1.0' in text
    assert 'everycycle_model_unloads_total{model="small",reason="keep_alive"} 0.0' in text
    assert 'everycycle_model_loads_total{model="small"} 2.0' in text
    assert 'everycycle_model_pull_state{model="big",state="pulling"} 1.0' in text
    rows, got = models_from_metrics(text, 0.0, {})
    lines = model_lines(Serving(Source(True), models=rows, pull=got))
    assert lines == ["small: 150 MiB resident of 200 MiB planned, n/a tok/s",
                     "pulling big: pulling, 3,072 MiB of 12,288 MiB (25 %), 100.0 MiB/s"]
