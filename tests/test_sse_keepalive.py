"""SSE streams say they are alive while the engine is quiet (#55: a stalled engine's streams got no byte for 22 s)."""

from __future__ import annotations

import contextvars
import threading
import time

import pytest

from host_runtime.serving.sse_keepalive import COMMENT, with_keepalive

request_var = contextvars.ContextVar("request", default=None)


def slow(gaps: list[float], fail: bool = False, seen: list | None = None):
    for i, gap in enumerate(gaps):
        time.sleep(gap)
        if seen is not None:
            seen.append((request_var.get(), threading.current_thread().name))
        yield f"data: {i}\n\n".encode()
    if fail:
        raise RuntimeError("the engine went away")


def test_a_comment_fills_each_quiet_stretch_and_the_chunks_keep_their_order():
    out = list(with_keepalive(slow([0.0, 0.35, 0.0]), every_s=0.1))
    chunks = [c for c in out if c != COMMENT]
    assert chunks == [b"data: 0\n\n", b"data: 1\n\n", b"data: 2\n\n"]
    assert 2 <= out.count(COMMENT) <= 4 and out.index(COMMENT) > 0 and out[-1] == b"data: 2\n\n"


def test_no_comment_where_chunks_come_often_and_the_requests_context_is_carried():
    seen: list = []
    request_var.set("req-1")
    assert COMMENT not in list(with_keepalive(slow([0.0] * 20, seen=seen), every_s=0.5))
    assert {s[0] for s in seen} == {"req-1"} and {s[1] for s in seen} == {"sse-pump"}


def test_an_error_inside_the_stream_reaches_its_reader():
    with pytest.raises(RuntimeError, match="went away"):
        list(with_keepalive(slow([0.0], fail=True), every_s=0.5))


def test_a_reader_that_leaves_stops_the_stream_at_its_next_chunk():
    produced: list = []

    def endless():
        for i in range(10_000):
            produced.append(i)
            time.sleep(0.01)
            yield b"x"

    stream = with_keepalive(endless(), every_s=1.0)
    next(stream)
    stream.close()
    time.sleep(0.2)
    n = len(produced)
    time.sleep(0.2)
    assert len(produced) == n < 100
