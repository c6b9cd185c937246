"""SSE streams say they are alive while the engine is quiet (#55: a stalled engine's streams got no byte for 22 s),
from the engine stream's own wait (engine/ipc.py), with no thread handing each event on."""

from __future__ import annotations

import http.client
import json
import os
import socket
import threading
import time

import pytest

from host_runtime.engine import wire
from host_runtime.engine.client import QUIET, GenerationStream
from host_runtime.engine.ipc import EngineUnavailable, LineStream
from host_runtime.serving.sse_keepalive import KEEPALIVE_COMMENT
from tests.conftest import MODEL_ID
from tests.servers import running_serve


def engine_side(gaps: list[float], lines: list[dict]):
    """A socket pair: the worker's end, and a thread writing `lines` on the engine's end after each gap."""
    worker, engine = socket.socketpair()

    def write():
        for gap, line in zip(gaps, lines):
            time.sleep(gap)
            engine.sendall(json.dumps(line).encode() + b"\n")

    threading.Thread(target=write, daemon=True).start()
    return worker, engine


def test_a_quiet_stretch_answers_quiet_and_the_next_line_still_comes():
    worker, _engine = engine_side([0.0, 0.35, 0.0], [{"n": 0}, {"n": 1}, {"n": 2}])
    lines = LineStream(worker, first_event_timeout=5, idle_timeout=5)
    got = []
    while len([g for g in got if g is not None]) < 3:
        got.append(lines.next_line_or_quiet(0.1))
    assert [g for g in got if g is not None] == [{"n": 0}, {"n": 1}, {"n": 2}]
    assert 2 <= got.count(None) <= 4 and got[0] == {"n": 0}


def test_quiet_answers_do_not_stretch_the_idle_timeout():
    worker, _engine = engine_side([], [])
    lines = LineStream(worker, first_event_timeout=0.4, idle_timeout=0.4)
    started, quiet = time.monotonic(), 0
    with pytest.raises(EngineUnavailable, match="sent nothing for 0.4s"):
        while True:
            assert lines.next_line_or_quiet(0.1) is None
            quiet += 1
    assert 0.35 < time.monotonic() - started < 1.0 and 2 <= quiet <= 4


def test_a_generation_stream_yields_quiet_only_where_asked():
    token = {"type": "token", "index": 0, "text": "hi"}
    done = {"type": "done", "prompt_tokens": 3}
    for quiet_s, expect_quiet in ((0.05, True), (None, False)):
        worker, _engine = engine_side([0.0, 0.25, 0.0], [token, token, done])
        stream = GenerationStream(LineStream(worker, 5, 5), wire.Accepted(prompt_tokens=3))
        stream.quiet_s = quiet_s
        events = list(stream)
        assert (QUIET in events) == expect_quiet
        assert [type(e) for e in events if e is not QUIET] == [wire.Token, wire.Token, wire.Done]


@pytest.mark.system
def test_every_sse_endpoint_sends_comments_while_the_engine_is_slow(tmp_path):
    """The engine slowed to 0.4 s a call, the keep-alive shortened to 0.1 s: comments among the chunks of
    OpenAI's chat and completions, Anthropic's messages and the Responses API (/infill's: the next test, the
    default model has no fill-in-the-middle tokens); the clients' own parsers (the openai SDK) read through them."""
    import openai

    env = {**os.environ, "EVERYCYCLE_TEST_DECODE_DELAY_S": "0.4", "EVERYCYCLE_TEST_KEEPALIVE_S": "0.1"}
    with running_serve(["--threads", "2", "--workers", "1", "--parallel", "1", "--ctx-size", "512"], tmp_path,
                       "the server", env=env) as (base, _):
        host, port = base.removeprefix("http://").split(":")
        # each with what its stream's last event says (it ended as it should, the comments skipped)
        # each path's body and the last event's possible endings
        bodies = {"/v1/chat/completions": ({"messages": [{"role": "user", "content": "Hi"}]}, ("data: [DONE]",)),
                  "/v1/completions": ({"prompt": "Hi"}, ("data: [DONE]",)),
                  "/v1/messages": ({"messages": [{"role": "user", "content": "Hi"}]}, ('"message_stop"}',)),
                  # the Responses API's own limit (it reads no max_tokens): it ends incomplete at 3 tokens
                  "/v1/responses": ({"input": "Hi", "max_output_tokens": 3},
                                    ('"response.completed"', '"response.incomplete"'))}
        for path, (body, ends) in bodies.items():
            conn = http.client.HTTPConnection(host, int(port), timeout=60)
            conn.request("POST", path, json.dumps({"model": MODEL_ID, "stream": True, "max_tokens": 3,
                                                   "n_predict": 3, **body}),
                         {"Content-Type": "application/json"})
            resp = conn.getresponse()
            text = resp.read().decode()
            conn.close()
            assert resp.status == 200, (path, text[:300])
            events = [e for e in text.split("\n\n") if e]
            assert KEEPALIVE_COMMENT.decode().strip() in events and any(e in events[-1] for e in ends), \
                (path, text[-400:])
        client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
        pieces = [c.choices[0].delta.content for c in client.chat.completions.create(
            model=MODEL_ID, messages=[{"role": "user", "content": "Hi"}], max_tokens=3, stream=True) if c.choices]
        assert len([p for p in pieces if p]) >= 1


def test_infill_answers_quiet_with_a_comment():
    from host_runtime.serving.infill import InfillLogic

    class Stream(list):
        prompt_tokens = 3

        def close(self):
            pass

    stream = Stream([QUIET, wire.Token(0, "x"), QUIET, wire.Finish(0, "length", 1), wire.Done(3)])
    out = list(InfillLogic(None)._lines(stream, "m", time.monotonic()))
    assert out.count(KEEPALIVE_COMMENT) == 2 and out[0] == KEEPALIVE_COMMENT
    assert b'"content":"x"' in out[1] and b'"stop":true' in out[-1]
