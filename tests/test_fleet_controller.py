"""The fleet controller's decisions (pure) and the gateway's settings."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from host_runtime.common.settings_file import SettingsError
from host_runtime.fleet.capabilities import Capabilities, GovernorView, ModelCapability
from host_runtime.fleet.controller import FAILURES_TO_REMOVE, BoxHealth, Registered, Report, Worker, changes, decide
from host_runtime.fleet.router_process import ADMIN_KEY_ENV, argv, control_plane_key_arg, environment, trust_bundle
from host_runtime.fleet.settings import FleetSettings

A, B, C = "http://10.0.0.2:8080", "http://10.0.0.3:8080", "http://10.0.0.4:8080"


def caps(*models: tuple[str, str], governor: str = "normal", draining: bool = False) -> Capabilities:
    level = {"normal": 0, "throttled": 1, "emergency": 2}.get(governor)
    return Capabilities("box", "v1", GovernorView(governor, level, ""),
                        tuple(ModelCapability(m, state) for m, state in models), draining=draining,
                        draining_reason="update to v2 is writing" if draining else "")


def pairs(decision) -> set[tuple[str, str]]:
    return {(w.box, w.model_id) for w in decision.workers.values()}


def test_a_model_loaded_on_one_box_goes_only_there_and_a_model_only_in_stores_to_one_box_that_has_it():
    d = decide([Report(A, caps(("smol", "loaded"), ("big", "available"))),
                Report(B, caps(("smol", "available"), ("big", "available"))),
                Report(C, caps(("solo", "loaded")))], BoxHealth())
    assert pairs(d) == {(A, "smol"), (A, "big"), (C, "solo")}  # nothing tells A and B apart: the first by name
    assert d.workers[f"{A}/fleet/smol"] == Worker.of(A, "smol")


def test_a_loading_model_counts_as_warm_and_downloading_or_failed_ones_are_not_routable():
    d = decide([Report(A, caps(("m", "loading"), ("x", "downloading"))), Report(B, caps(("m", "available"),
                                                                                       ("x", "failed")))], BoxHealth())
    assert pairs(d) == {(A, "m")}


def test_boxes_in_emergency_or_draining_get_no_work_and_say_why():
    d = decide([Report(A, caps(("m", "loaded"), governor="emergency")), Report(B, caps(("m", "loaded"), draining=True)),
                Report(C, caps(("m", "available")))], BoxHealth())
    assert pairs(d) == {(C, "m")}
    assert "emergency" in d.left_out[A] and "draining" in d.left_out[B]


def test_a_throttled_box_is_left_out_while_an_unthrottled_one_has_the_model_warm():
    reports = [Report(A, caps(("m", "loaded"), governor="throttled")), Report(B, caps(("m", "loaded")))]
    assert pairs(decide(reports, BoxHealth())) == {(B, "m")}
    # Throttled everywhere: still served.
    both = [Report(A, caps(("m", "loaded"), governor="throttled")), Report(B, caps(("m", "loaded"), governor="throttled"))]
    assert pairs(decide(both, BoxHealth())) == {(A, "m"), (B, "m")}


def test_a_box_that_misses_one_poll_keeps_its_workers_and_loses_them_after_two_then_rejoins():
    health = BoxHealth()
    up = [Report(A, caps(("m", "loaded"))), Report(B, caps(("m", "loaded")))]
    first = decide(up, health)
    down = [Report(A, caps(("m", "loaded"))), Report(B, None, "connection refused")]
    second = decide(down, health, first)
    assert pairs(second) == {(A, "m"), (B, "m")}
    assert FAILURES_TO_REMOVE == 2
    third = decide(down, health, second)
    assert pairs(third) == {(A, "m")} and "connection refused" in third.left_out[B]
    assert pairs(decide(up, health, third)) == {(A, "m"), (B, "m")}


def test_changes_add_what_is_missing_remove_what_is_not_wanted_and_replace_a_changed_model():
    d = decide([Report(A, caps(("m", "loaded"))), Report(B, caps(("m", "loaded")))], BoxHealth())
    registered = [Registered("1", f"{A}/fleet/m", "m"), Registered("2", f"{C}/fleet/m", "m"),
                  Registered("3", f"{B}/fleet/m", "other")]
    add, remove = changes(d, registered)
    assert {r.id for r in remove} == {"2", "3"}
    assert add == [Worker.of(B, "m")]
    assert changes(d, [Registered("1", f"{A}/fleet/m", "m"), Registered("4", f"{B}/fleet/m", "m")]) == ([], [])


def test_model_names_are_quoted_in_worker_urls():
    assert Worker.of(A + "/", "a b/c").url == f"{A}/fleet/a%20b%2Fc"


@pytest.mark.parametrize("doc, field", [
    ({"role": "leader"}, "role"), ({"policy": "fastest"}, "policy"), ({"peers": ["10.0.0.2:8080"]}, "peers[0]"),
    ({"peers": ["http://10.0.0.2:8080/v1"]}, "peers[0]"), ({"peers": [A, A + "/"]}, "peers"),
    ({"role": "gateway"}, "peers"), ({"router_port": 0}, "router_port"), ({"metrics_port": 8090}, "metrics_port"),
    ({"poll_interval_s": 0.0}, "poll_interval_s"), ({"mdns": "yes"}, "mdns"),
])
def test_bad_fleet_settings_name_their_field(doc, field):
    with pytest.raises(SettingsError) as err:
        FleetSettings(**doc)
    assert err.value.field == field


def test_the_router_routes_by_model_on_loopback_with_the_chosen_policy():
    args = argv(FleetSettings(role="gateway", peers=(A,), policy="round_robin", router_port=9000))
    assert "--enable-igw" in args
    assert args[args.index("--host") + 1] == "127.0.0.1" and args[args.index("--port") + 1] == "9000"
    assert args[args.index("--policy") + 1] == "round_robin"
    assert "--worker-urls" not in args and "--api-key" not in args  # workers and their key come over its API
    # Its control-plane key travels in its environment (the process's own user reads it), never in argv.
    assert not any("control-plane" in a for a in args) and args[1:3] == ["-m", "host_runtime.fleet.router_main"]
    env = environment({}, Path("/v"), admin_key="k" * 40)
    assert env[ADMIN_KEY_ENV] == "k" * 40 and ADMIN_KEY_ENV not in environment({}, Path("/v"))
    assert control_plane_key_arg("k" * 40)[1].split(":")[2:] == ["admin", "k" * 40]
    with pytest.raises(ValueError):
        control_plane_key_arg("a:b")


@pytest.mark.system
def test_the_routers_control_plane_answers_only_the_gateways_key(tmp_path):
    """The third hardening review: any client key (through the front) and any local process reached /workers
    and /v1/tokenizers. Started as the gateway starts it, the router refuses them without its admin key, and
    the key is not on its command line."""
    import json
    import secrets
    import subprocess
    import time
    import urllib.error
    import urllib.request

    from host_runtime.fleet import router_vocab
    from host_runtime.fleet.router_api import RouterAPI, RouterUnavailable
    from tests.servers import free_port

    port, key = free_port(), secrets.token_urlsafe(32)
    settings = FleetSettings(role="gateway", peers=(A,), router_port=port, metrics_port=free_port())
    proc = subprocess.Popen(argv(settings), env=environment(dict(os.environ), router_vocab.default_dir(), None, key),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        api = RouterAPI(f"http://127.0.0.1:{port}", admin_key=key)
        deadline = time.monotonic() + 30
        while not api.alive():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        assert api.workers() == [] and api.models() == []
        with pytest.raises(RouterUnavailable, match="HTTP 401"):
            RouterAPI(f"http://127.0.0.1:{port}").workers()
        for method, path in (("GET", "/workers"), ("POST", "/workers"), ("GET", "/v1/tokenizers"),
                             ("POST", "/v1/tokenizers")):
            req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method,
                                         data=json.dumps({"url": "http://127.0.0.1:1"}).encode() if method == "POST"
                                         else None, headers={"Content-Type": "application/json",
                                                             "Authorization": "Bearer ec-a-client-key"})
            with pytest.raises(urllib.error.HTTPError) as err:
                urllib.request.urlopen(req, timeout=5)
            assert err.value.code == 401, (method, path)
        cmdline = open(f"/proc/{proc.pid}/cmdline", "rb").read()
        assert key.encode() not in cmdline and b"control-plane" not in cmdline
    finally:
        proc.terminate()
        proc.wait(10)


def test_a_busy_box_is_retried_with_backoff_never_circuit_broken_and_cache_aware_spills_early():
    args = argv(FleetSettings(role="gateway", peers=(A,), policy="cache_aware"))
    assert "--disable-circuit-breaker" in args
    assert int(args[args.index("--retry-max-retries") + 1]) >= 5
    assert int(args[args.index("--retry-initial-backoff-ms") + 1]) >= 250   # the box asks for 2 s (Retry-After)
    assert int(args[args.index("--balance-abs-threshold") + 1]) < 64       # the router's default
    assert "--balance-abs-threshold" not in argv(FleetSettings(role="gateway", peers=(A,), policy="round_robin"))


def test_the_routers_openssl_client_trusts_each_peer_certificate_and_no_public_ca(tmp_path):
    """The router trusted the system's CAs beside the peers' certificates: a peer named by DNS was anyone a public
    CA vouched for, and it gets the fleet key (hardening #35, item 3)."""
    bundle = trust_bundle([b"-----PEER 1-----\n", b"-----PEER 2-----"])
    assert bundle == b"-----PEER 1-----\n-----PEER 2-----\n"
    assert environment({}, tmp_path, tmp_path / "trust.pem")["SSL_CERT_FILE"] == str(tmp_path / "trust.pem")
    assert "SSL_CERT_FILE" not in environment({}, tmp_path)


def test_boxes_found_by_mdns_come_after_the_configured_ones_and_none_twice():
    from host_runtime.fleet.controller import merge_peers

    assert merge_peers((A, B), (B + "/", "https://10.0.0.9:8443")) == (A, B, "https://10.0.0.9:8443")
    assert merge_peers((A,), ()) == (A,)


def test_an_unroutable_request_is_a_404_naming_the_fleets_models_only_when_no_box_serves_it():
    from host_runtime.serving.fleet_unroutable import explain

    missing = explain("Big-Model", ["SmolLM2", "Solo"])
    assert (missing.status, missing.code, missing.param) == (404, "model_not_found", "model")
    assert "it has: SmolLM2, Solo" in missing.message
    busy = explain("Solo", ["SmolLM2", "Solo"])   # served, but the router found no box that could take it now
    assert (busy.status, busy.code, busy.retry_after) == (503, "fleet_unavailable", 2)
    # The router did not say, or the request named no model: not a 404 the client could act on.
    assert explain("Big-Model", None).status == 503 and explain(None, ["Solo"]).status == 503
    assert "none yet" in explain("Solo", []).message


def test_the_unroutable_answer_survives_any_body_the_router_refused():
    import falcon
    import falcon.testing

    from host_runtime.serving.errors import APIError, handle_api_error
    from host_runtime.serving.fleet_unroutable import FleetUnroutable

    app = falcon.App()
    app.add_route("/u", FleetUnroutable("127.0.0.1:1", 1 << 20))   # no router there: it does not say
    app.add_error_handler(APIError, handle_api_error)
    client = falcon.testing.TestClient(app)
    for body in (b'{"model": "Solo"}', b"[" * 100_000, b"not json", b'["a list"]'):
        r = client.simulate_post("/u", body=body, headers={"Content-Type": "application/json"})
        assert r.status_code == 503 and r.json["error"]["code"] == "fleet_unavailable", body[:20]
    assert "that serves 'Solo'" in client.simulate_post("/u", body=b'{"model": "Solo"}').json["error"]["message"]


def busy(model: str, speed: float | None, *, free: int = 2, queue: int = 0) -> Capabilities:
    return Capabilities("box", "v1", GovernorView("normal", 0, ""), (ModelCapability(
        model, "loaded", slots_total=4, slots_free=free, queue_depth=queue, prefill_tokens_per_s=speed),))


def test_a_box_much_slower_than_the_fastest_gets_the_model_only_while_the_faster_ones_are_full():
    """#62: the router's cache_aware balances by request counts and prefixes, blind to speed; the controller
    leaves a warm box under SLOW_SHARE of the fastest's measured speed out of a model's workers until every faster
    one is full, lets it in for SPILL_HOLD_S, forgets a speed not measured for SPEED_MEMORY_S (the box is tried
    again), and does none of it where route_by_speed is off (speeds None)."""
    from host_runtime.fleet.controller import SPEED_MEMORY_S, SPILL_HOLD_S, Speeds

    speeds, health = Speeds(), BoxHealth()
    fast, slow, close = busy("m", 30.0), busy("m", 9.0), busy("m", 20.0)
    assert pairs(decide([Report(A, fast), Report(B, slow), Report(C, close)], health, None, speeds, 0.0)) == {
        (A, "m"), (C, "m")}
    assert pairs(decide([Report(A, fast), Report(B, slow)], health, None, None, 0.0)) == {(A, "m"), (B, "m")}
    # the fast ones full (no free sequence on one, a queue on the other): the slow box takes the overflow
    full = [Report(A, busy("m", 30.0, free=0)), Report(B, slow), Report(C, busy("m", 20.0, queue=3))]
    assert pairs(decide(full, health, None, speeds, 10.0)) == {(A, "m"), (B, "m"), (C, "m")}
    room = [Report(A, fast), Report(B, slow), Report(C, close)]
    assert (B, "m") in pairs(decide(room, health, None, speeds, 10.0 + SPILL_HOLD_S - 0.5))  # held a moment
    last = 10.0 + SPILL_HOLD_S + 0.5
    assert (B, "m") not in pairs(decide(room, health, None, speeds, last))
    # idle since: no fresh speed; the last one is remembered a while, then the box is tried again
    quiet = [Report(A, fast), Report(B, busy("m", None)), Report(C, close)]
    assert (B, "m") not in pairs(decide(quiet, health, None, speeds, last + SPEED_MEMORY_S - 1))
    assert (B, "m") in pairs(decide(quiet, health, None, speeds, last + SPEED_MEMORY_S + 1))
    # a model only in stores is not judged by speed but by where it loads soonest (the next test)
    cold = [Report(A, caps(("c", "available"))), Report(B, caps(("c", "available")))]
    assert pairs(decide(cold, health, None, speeds, 100.0)) == {(A, "c")}


def stored(room: str | None, *, loaded_bytes: int = 0, load_s: float = 0.0, governor: str = "normal",
           size: int = 4 * 10**9) -> Capabilities:
    """A box with model "big" in its store only (loading it would find `room`), beside a loaded model of
    loaded_bytes that took load_s to load."""
    models = (ModelCapability("big", "available", room=room, size_bytes=size),
              ModelCapability("own", "loaded", size_bytes=loaded_bytes or None, load_s=load_s or None))
    level = {"normal": 0, "throttled": 1}[governor]
    return Capabilities("box", "v1", GovernorView(governor, level, ""), models)


def test_a_model_only_in_stores_goes_to_the_one_box_that_loads_it_soonest():
    """#62: its first requests load it once, where room is readiest and loads are fastest, not on every box."""
    def goes_to(*reports: Report) -> set[str]:
        return {box for box, model in pairs(decide(list(reports), BoxHealth())) if model == "big"}

    gb = 10**9
    # room beside what is loaded before room made by unloading an idle model, before room busy ones hold
    assert goes_to(Report(A, stored("unloads")), Report(B, stored("free"))) == {B}
    assert goes_to(Report(A, stored("waits")), Report(B, stored("unloads"))) == {B}
    # the same room: the box that loads faster (1 GB in 10 s against 1 GB in 2 s: 40 s against 8 s for 4 GB)
    assert goes_to(Report(A, stored("free", loaded_bytes=gb, load_s=10.0)),
                   Report(B, stored("free", loaded_bytes=gb, load_s=2.0))) == {B}
    # a box whose load rate is unknown comes after one whose rate is known
    assert goes_to(Report(A, stored("free")), Report(B, stored("free", loaded_bytes=gb, load_s=10.0))) == {B}
    # never fitting is left out however fast; where it fits nowhere, every box (each says why: 507)
    assert goes_to(Report(A, stored("free", loaded_bytes=gb, load_s=10.0)),
                   Report(B, stored("never", loaded_bytes=gb, load_s=1.0))) == {A}
    assert goes_to(Report(A, stored("never")), Report(B, stored("never"))) == {A, B}
    # a throttled box is left out while another has the model (as for warm ones)
    assert goes_to(Report(A, stored("unloads", loaded_bytes=gb, load_s=10.0)),
                   Report(B, stored("free", loaded_bytes=gb, load_s=1.0, governor="throttled"))) == {A}
    # once it loads there, it is warm there: only that box, whatever the others' room
    loading = Capabilities("box", "v1", GovernorView("normal", 0, ""), (ModelCapability("big", "loading"),))
    assert goes_to(Report(A, loading), Report(B, stored("free", loaded_bytes=gb, load_s=1.0))) == {A}


def test_an_engines_speed_is_its_prompt_rate_whatever_the_mix():
    """The capability map's prefill_tokens_per_s: prompt tokens computed per second of the calls that computed
    them over the last SPEED_WINDOW_S: neither an idle stretch nor a stretch of decoding reads as a slow box
    (tokens_per_s, demand's figure, falls in both)."""
    from host_runtime.engine.metrics import SPEED_WINDOW_S, EngineMetrics

    m = EngineMetrics()

    def at(when: float, **counts: float) -> None:
        with m._lock:
            for name, value in counts.items():
                m.counters[name] += value
            m._sample_tokens_locked(when)

    at(100.0, prompt_seconds_total=2.0, prompt_tokens_total=400)   # a 400-token prompt in 2 s of calls
    for i in range(40):  # then 40 tokens generated over 8 s: no prompt work
        at(101.0 + i * 0.2, predicted_seconds_total=0.2, tokens_predicted_total=1)
    at(110.0, prompt_seconds_total=1.0, prompt_tokens_total=200)   # another prompt: 200 tokens in 1 s
    recent = m.recent(now=120.0)  # 10 s idle since
    # (400 + 200 - 400) / (3 - 2): the window's first sample is its start; generated tokens change nothing
    assert recent["prefill_tokens_per_s"] == 200.0 and recent["tokens_per_s"] < 10
    assert m.recent(now=111.0 + SPEED_WINDOW_S)["prefill_tokens_per_s"] is None  # nothing lately: unknown, not 0
