"""The gateway's state file (pure): written and read through one set of types; `fleet status` renders it."""

from __future__ import annotations

import json

from host_runtime.fleet.capabilities import Capabilities, GovernorView, ModelCapability
from host_runtime.fleet.controller import Registered, Report, Worker
from host_runtime.fleet.state import GatewayState, box_state, render

A, B, C = "https://10.0.0.3:8443", "https://10.0.0.4:8443", "http://127.0.0.1:8081"


def caps(name: str, version: str, *, draining: bool = False) -> Capabilities:
    return Capabilities(box=name, version=version, governor=GovernorView("normal", 0),
                        models=(ModelCapability("m", "loaded", prefill_tokens_per_s=12.5, shard_hosts=[
                                    {"host": "10.0.0.5:50052", "devices": ["RPC0"], "round_trip_ms": 0.19,
                                     "mbytes_per_s": 283.0}]),
                                ModelCapability("big", "downloading")),
                        draining=draining, draining_reason="update to 2026.12.05 is installed" if draining else "",
                        slot="B" if draining else "A")


def test_the_state_round_trips_and_says_each_boxs_version_slot_and_state():
    state = GatewayState(1000.0, "cache_aware", (
        box_state(Report(C, caps("gw-a", "2026.12.04")), ""),
        box_state(Report(A, caps("box-b", "2026.12.04", draining=True)), "draining: update to 2026.12.05 is installed"),
        box_state(Report(B, None, "connection refused"), "")),
        (Worker.of(C, "m"),), (Registered("1", Worker.of(C, "m").url, "m"),))
    again = GatewayState.from_json(json.loads(json.dumps(state.to_json())))
    assert again == state
    a, b, c = again.boxes
    assert (a.name, a.version, a.slot, a.models, a.summary()) == ("gw-a", "2026.12.04", "A", ("m",), "serving")
    assert b.draining and b.summary() == "left out: draining: update to 2026.12.05 is installed"
    assert not c.answering and c.summary() == "not answering (connection refused)"
    lines = render(again, now=1004.0)
    assert lines[0] == "fleet gateway (cache_aware), polled 4 s ago: 1 of 3 boxes serving, 1 workers in the router"
    assert "box-b  2026.12.04  slot B  left out: draining" in lines[2]
    assert lines[3].startswith(f"  {B}  ?  ?  slot ?  not answering")
    assert lines[1].endswith("models: m  prefill speed: m 12.5 tok/s  m across 10.0.0.5:50052 (0.19 ms, 283 MB/s)")
    assert lines[4] == f"  m -> {C}"


def test_a_state_file_from_an_older_gateway_still_reads():
    old = {"at_unix": 5.0, "policy": "round_robin", "boxes": [{"box": A, "answering": True, "error": "",
                                                               "left_out": ""}],
           "workers": [], "registered": [], "something_new": 1}
    state = GatewayState.from_json(old)
    assert state.boxes[0].summary() == "serving" and state.boxes[0].version == ""
