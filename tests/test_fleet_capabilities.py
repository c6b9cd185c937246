"""The capability map's contract (pure): what a box says, read back by the fleet's side, and which boxes take
new work."""

from __future__ import annotations

import pytest

from host_runtime.fleet.capabilities import (Capabilities, GovernorView, ModelCapability, draining_from_update,
                                             governor_view)


def caps(**kw) -> Capabilities:
    base = dict(box="box-1", version="1.2.0", governor=GovernorView("normal", 0, "GPUs: controlling"),
                models=(ModelCapability("smol", "loaded", 4096, True, {"CPU": 31}, 4, 3, 0, 12.5, 0.05, {"ram": 10}),
                        ModelCapability("big", "available", 8192), ModelCapability("new", "downloading")))
    return Capabilities(**{**base, **kw})


def test_the_map_round_trips_and_a_newer_boxs_extra_fields_are_ignored():
    c = caps()
    wire = c.to_wire()
    assert wire["object"] == "everycycle.capabilities" and wire["models"][0]["placement"] == {"CPU": 31}
    assert Capabilities.from_wire(wire) == c
    wire["future_field"] = 1
    wire["models"][0]["future_field"] = 2
    assert Capabilities.from_wire(wire) == c
    with pytest.raises(ValueError, match="not a capability map"):
        Capabilities.from_wire({"object": "list"})
    with pytest.raises(ValueError, match="lacks"):
        Capabilities.from_wire({"object": "everycycle.capabilities", "box": "b"})


def test_which_models_route_here_and_when_the_box_takes_no_new_work():
    c = caps()
    assert c.accepts_new_work() == (True, "")
    assert c.routable("smol") and c.routable("big") and not c.routable("new") and not c.routable("other")
    hot = caps(governor=GovernorView("emergency", 2, "GPUs: emergency"))
    assert not hot.routable("smol") and "emergency" in hot.accepts_new_work()[1]
    draining = caps(draining=True, draining_reason="update to 1.3.0 is writing")
    assert draining.accepts_new_work() == (False, "draining: update to 1.3.0 is writing")
    assert caps(governor=GovernorView("throttled", 1)).routable("smol")  # throttled: fewer slots, still open


def test_the_governor_and_the_update_record_as_the_map_says_them():
    assert governor_view({"throttle_level": 2, "gpus": [{"state": "emergency"}, {"state": "controlling"}]}, True, "") \
        == GovernorView("emergency", 2, "GPUs: controlling, emergency")
    assert governor_view({"throttle_level": 1, "gpus": []}, True, "").state == "throttled"
    assert governor_view({"throttle_level": 0}, False, "the governor's state is 95 s old") == \
        GovernorView("unavailable", None, "the governor's state is 95 s old")
    assert draining_from_update({"phase": "writing", "target": "1.3.0"}) == (True, "update to 1.3.0 is writing")
    assert draining_from_update({"phase": "installed", "target": "1.3.0"})[0]
    assert draining_from_update({"phase": "blessed", "target": "1.3.0"}) == (False, "")
    assert draining_from_update(None) == (False, "")
