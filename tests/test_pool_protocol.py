"""The engine pool's control messages (pure): typed both ways, and a refusal comes back as the engine's
RequestRejected."""

from __future__ import annotations

import pytest

from host_runtime.engine.errors import RequestRejected
from host_runtime.pool.protocol import (Acquire, Download, ListModels, PoolMetrics, PoolModel, Unload,
                                               _raise_refusal, refusal_to_wire, request_from_wire, request_to_wire)


def test_requests_round_trip_and_a_bad_one_is_a_value_error():
    for request in (Acquire("tiny", 30.0), Acquire("tiny"), Acquire("tiny", None), ListModels(), Unload("tiny"),
                    PoolMetrics()):
        assert request_from_wire(request_to_wire(request)) == request
    assert request_to_wire(Acquire("m", None)) == {"op": "acquire", "model": "m", "keep_alive": None}
    with pytest.raises(ValueError, match="unknown engine pool op 'load'"):
        request_from_wire({"op": "load"})
    with pytest.raises(ValueError, match="acquire"):
        request_from_wire({"op": "acquire"})


def test_models_round_trip_and_refusals_are_the_engines_typed_error():
    row = PoolModel("big", "downloading", download=Download(10, 100, None))
    assert PoolModel.from_wire(row.to_wire()) == row
    assert PoolModel.from_wire({"id": "a", "state": "loaded"}) == PoolModel("a", "loaded")
    wire = refusal_to_wire(RequestRejected(507, "too big", param="model", code="insufficient_memory",
                                           error_type="server_error"))
    with pytest.raises(RequestRejected) as err:
        _raise_refusal(wire)
    assert (err.value.status, err.value.code, err.value.param) == (507, "insufficient_memory", "model")
    assert _raise_refusal({"models": []}) == {"models": []}
