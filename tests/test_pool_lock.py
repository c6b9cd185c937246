"""The engine pool's lock is not held while an engine stops (pure: fake engine children, no processes)."""

from __future__ import annotations

import threading
import time

import pytest

from host_runtime.pool.pool import EnginePool, Loaded


class SlowChild:
    """An engine child whose stop takes as long as a stuck engine's (EngineChild waits up to 10 s)."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.stopped = threading.Event()

    def stop(self):
        time.sleep(self.seconds)
        self.stopped.set()


def test_stopping_an_engine_does_not_stall_the_pools_other_answers(tmp_path):
    """The third hardening review: stopping an engine held the pool lock up to 10 s, which stalled /v1/models,
    /metrics and the capability map until the fleet's gateway dropped the box."""
    pool = EnginePool(run_dir=tmp_path, default_name="default", default_path=str(tmp_path / "d.gguf"),
                      default_socket=str(tmp_path / "d.sock"), default_child=None, engine_options=lambda p: None,
                      store=None, budget_bytes=1 << 30, need_for=lambda path: 1 << 20, keep_alive_s=None)
    slow = SlowChild(3.0)
    pool._loaded["slow"] = Loaded("slow", str(tmp_path / "slow.gguf"), str(tmp_path / "slow.sock"), slow, False, None)
    stopper = threading.Thread(target=pool.unload, args=("slow",))
    stopper.start()
    time.sleep(0.2)  # the unload has begun stopping the engine
    started = time.monotonic()
    snapshot = pool.snapshot()
    took = time.monotonic() - started
    stopper.join()
    assert took < 1.0, f"the pool answered after {took:.1f} s, behind the engine's stop"
    assert "slow" not in snapshot["memory"] and slow.stopped.is_set()
    assert pool.unloads[("slow", "removed")] == 1 and pool._stopping_bytes == 0


def test_a_request_may_lengthen_a_loaded_models_keep_alive_never_shorten_it(tmp_path):
    """One key's keep_alive (0 included) set how long a model stayed for every key: any client could unload the
    model the others were using after each of its requests (hardening #35, item 7)."""
    from host_runtime.pool.pool import longer_keep_alive

    pool = EnginePool(run_dir=tmp_path, default_name="default", default_path=str(tmp_path / "d.gguf"),
                      default_socket=str(tmp_path / "d.sock"), default_child=None, engine_options=lambda p: None,
                      store=None, budget_bytes=1 << 30, need_for=lambda path: 1 << 20, keep_alive_s=300.0)
    pool._loaded["m"] = Loaded("m", str(tmp_path / "m.gguf"), str(tmp_path / "m.sock"), None, False, 300.0)
    for asked, kept in ((0.0, 300.0), (60.0, 300.0), ("default", 300.0), (900.0, 900.0), (0.0, 900.0),
                        (None, None), (5.0, None)):
        pool.acquire("m", asked)
        assert pool._loaded["m"].keep_alive_s == kept, (asked, kept)
    assert longer_keep_alive(1.0, 2.0) == 2.0 and longer_keep_alive(None, 2.0) is None


def test_requests_waiting_for_a_load_are_bounded_and_the_rest_hear_at_once(tmp_path, monkeypatch):
    """A request waiting for a model's load held an HTTP thread up to 300 s, uncounted by the engine's admission:
    enough of them took every thread that requests for loaded models and /health needed (hardening #35, item 7)."""
    import types

    from host_runtime.engine.errors import RequestRejected
    from host_runtime.serving import routing

    monkeypatch.setattr(routing, "LOAD_WAIT_S", 5.0)
    monkeypatch.setattr(routing, "POLL_S", 0.05)
    pool = types.SimpleNamespace(acquire=lambda model, keep_alive: types.SimpleNamespace(
        socket=str(tmp_path / "never.sock")))  # an engine whose socket never comes: a load that never ends
    router = routing.Router(types.SimpleNamespace(info=lambda timeout: None))
    router._default_info = types.SimpleNamespace(model_id="default", ready=True)
    router.pool = pool
    outcomes = []

    def wait():
        try:
            router.engine_for("big")
        except RequestRejected as exc:
            outcomes.append((exc.status, exc.message))

    waiters = [threading.Thread(target=wait) for _ in range(routing.MAX_LOAD_WAITERS)]
    for t in waiters:
        t.start()
    deadline = time.monotonic() + 10
    while router._load_waiters._value and time.monotonic() < deadline:  # every waiter holds its place
        time.sleep(0.01)
    assert router._load_waiters._value == 0
    started = time.monotonic()
    wait()  # one more: told at once
    assert time.monotonic() - started < 1.0 and "requests already wait" in outcomes[-1][1]
    for t in waiters:
        t.join()
    assert [status for status, _ in outcomes] == [503] * (routing.MAX_LOAD_WAITERS + 1)
    assert sum("still loading after" in message for _, message in outcomes) == routing.MAX_LOAD_WAITERS
    wait()  # the waiters gone, a new request may wait again (until its own deadline)
    assert "still loading after" in outcomes[-1][1]


def test_a_request_waiting_for_a_load_hears_its_failure_at_once_and_its_end_when_ready(monkeypatch):
    """The wait asks the loading engine until it is ready; a load that fails is the request's answer (a 500 with
    the engine's reason) without waiting out LOAD_WAIT_S, and an engine not up yet is asked again."""
    import types

    from host_runtime.engine.errors import RequestRejected
    from host_runtime.engine.ipc import EngineUnavailable
    from host_runtime.engine.wire import EngineInfo
    from host_runtime.serving import routing

    monkeypatch.setattr(routing, "POLL_S", 0.01)
    router = routing.Router(types.SimpleNamespace(info=lambda timeout: None))

    def engine(*states: str):
        answers = iter(states)

        def info(timeout):
            state = next(answers)
            if state == "down":
                raise EngineUnavailable("no socket yet")
            return EngineInfo(state=state, reason="out of memory" if state == "failed" else "", model_id="big",
                              model_path="/m", pid=1)
        return types.SimpleNamespace(info=info)

    started = time.monotonic()
    with pytest.raises(RequestRejected) as failed:
        router._wait_for_load(engine("down", "loading", "failed"), "big")
    assert failed.value.status == 409 and "failed to load: out of memory" in failed.value.message
    assert time.monotonic() - started < 2
    client = engine("down", "loading", "loading", "ready")
    assert router._wait_for_load(client, "big") == (client, EngineInfo(state="ready", reason="", model_id="big",
                                                                       model_path="/m", pid=1))
