"""The engine's wire (pure): every request, reply and event goes through JSON and comes back as itself; a
malformed line is a WireError naming what is wrong, never a KeyError in the engine."""

from __future__ import annotations

import json

import pytest

from host_runtime.engine import wire
from host_runtime.engine.errors import RequestRejected
from host_runtime.engine.readiness import Verdict

REQUESTS = [
    wire.Generate(wire.ChatPrompt([{"role": "user", "content": "hi"}], [{"type": "function", "function": {
        "name": "f", "parameters": {}}}], False), 12, 2, ["\n\n"],
        wire.SamplingParams(temperature=0.0, seed=7, grammar="root ::= \"a\"", top_logprobs=2,
                            logit_bias={"42": -100.0}), speculation=False, cache_scope="team-a"),
    wire.Generate(wire.TextPrompt("The capital of France is")),
    wire.CountTokens(wire.ChatPrompt([{"role": "user", "content": "hi"}])),
    wire.Tokenize("hello <|im_start|>", add_special=True, with_pieces=True),
    wire.Detokenize([1, 2, 3]),
    wire.Embed(["a", "b"]),
    wire.Info(), wire.Metrics(), wire.Ready(max_age=1.5, wait=0.5),
]

EVENTS = [
    wire.Accepted(17),
    wire.Token(1, "Paris", wire.TokenLogprob("Paris", [80, 97], -0.1, [wire.TopLogprob("Lyon", [76], -3.0)])),
    wire.Token(0, "x"),
    wire.Finish(0, "stop", 5, "\n\n"),
    wire.Done(17, 16),
    wire.Error(RequestRejected(503, "the server is at capacity", code="queue_full", error_type="server_busy",
                               retry_after=2)),
    wire.TokenCount(9), wire.Tokenized([1, {"id": 2, "piece": [226]}]), wire.Detokenized("hi"),
    wire.Embeddings([[0.6, 0.8]], 3), wire.MetricsText("up 1\n"),
    wire.EngineInfo(state="ready", reason="model loaded", model_id="m", model_path="/m.gguf", pid=1, n_ctx=4096,
                    placement={"devices": []}, recent={"running": 0}),
    Verdict(True, "ready", "a canary passed", canaries=1),
]


def _through_json(doc: dict) -> dict:
    return json.loads(json.dumps(doc))


@pytest.mark.parametrize("request_", REQUESTS, ids=lambda r: type(r).__name__)
def test_every_request_comes_back_as_itself(request_):
    assert wire.request_from_wire(_through_json(wire.request_to_wire(request_))) == request_


@pytest.mark.parametrize("event", EVENTS, ids=lambda e: type(e).__name__)
def test_every_reply_and_event_comes_back_as_itself(event):
    back = wire.event_from_wire(_through_json(wire.event_to_wire(event)))
    if isinstance(event, wire.Error):  # an exception compares by identity: its fields instead
        assert back.error.to_wire() == event.error.to_wire()
    else:
        assert back == event


def test_done_carries_the_engines_timings_which_do_not_make_two_answers_differ():
    timings = wire.Timings(queued_s=0.5, restore_s=0.01, prefill_s=1.25, decode_s=3.0, parked_s=0.75, preemptions=1,
                           cache_hit="ram")
    back = wire.event_from_wire(_through_json(wire.event_to_wire(wire.Done(17, 16, timings))))
    assert back.timings == timings and back == wire.Done(17, 16)
    with pytest.raises(wire.WireError, match="done.timings"):
        wire.event_from_wire({"type": "done", "prompt_tokens": 1, "timings": {"queued": 1}})


def test_every_request_has_its_reply_type():
    assert set(wire.REPLY_OF) == set(wire.REQUESTS.values())


@pytest.mark.parametrize("doc,says", [
    ({"op": "load"}, "unknown engine op 'load'"),
    ("generate", "unknown engine op None"),
    ({"op": "generate"}, "prompt must have 'messages' or 'text'"),
    ({"op": "generate", "prompt": {"text": "a"}, "sampling": {"temprature": 1}}, "unknown fields ['temprature']"),
    ({"op": "generate", "prompt": {"text": "a"}, "stream": True}, "unknown fields ['stream']"),
    ({"op": "count_tokens", "prompt": {"text": "a"}}, "prompt must have 'messages'"),
    ({"op": "embed"}, "inputs"),
    ({"op": "ready", "max_age": 1, "wait": 2, "now": 3}, "unknown fields ['now']"),
])
def test_a_malformed_call_is_a_wire_error_naming_what_is_wrong(doc, says):
    with pytest.raises(wire.WireError) as err:
        wire.request_from_wire(doc)
    assert says in str(err.value)


@pytest.mark.parametrize("doc", [{"type": "tick"}, {"type": "error", "error": "boom"}, {"type": "finish"}, []])
def test_a_malformed_event_is_a_wire_error(doc):
    with pytest.raises(wire.WireError):
        wire.event_from_wire(doc)
