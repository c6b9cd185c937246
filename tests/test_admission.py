"""Room in the waiting queue (engine/admission.py): one key's flood and a batch job leave room for everyone else
(#55: one key's 200 requests took 176 places' worth of refusals from others, whose stream got in on its 4th try;
#56 item 7: a batch key filled the queue and every interactive request got 503)."""

from __future__ import annotations

from collections import Counter

import pytest

from host_runtime.engine.admission import key_share, refusal
from host_runtime.engine.engine import Engine, GenerationRequest
from host_runtime.engine.errors import RequestRejected
from host_runtime.engine.sampling import SamplingParams
from tests.fake_runner import FakeModel, FakeRunner


def test_a_key_alone_gets_half_the_queue_and_each_new_key_a_share():
    assert [key_share(16, others) for others in (0, 1, 2, 14, 30)] == [8, 5, 4, 1, 1]
    assert refusal(Counter({"a": 7}), 7, 16, "a", "default") is None
    refused = refusal(Counter({"a": 8}), 8, 16, "a", "default")
    assert (refused.status, refused.code) == (429, "queue_share_exceeded") and "'a'" in refused.message
    assert refusal(Counter({"a": 8}), 8, 16, "b", "default") is None  # the newcomer gets in
    assert refusal(Counter({None: 15}), 15, 16, None, "default") is None  # no keys: the queue as before
    assert refusal(Counter({None: 16}), 16, 16, None, "default").code == "queue_full"


def test_batch_requests_leave_the_last_quarter_to_the_other_classes():
    waiting = Counter({f"k{i}": 1 for i in range(12)})
    assert refusal(waiting, 12, 16, "k99", "batch").code == "queue_full"
    assert refusal(waiting, 12, 16, "k99", "interactive") is None
    assert refusal(Counter(), 0, 1, "k", "batch") is not None  # a queue of one keeps its place for people


@pytest.fixture
def engine():
    made = Engine(FakeModel(n_parallel=1), runner=FakeRunner(FakeModel(n_parallel=1)), max_waiting=16)
    yield made  # not started: what is submitted waits
    made.stop()


def submit(engine: Engine, key: str, priority: str = "default") -> int | None:
    try:
        engine.submit(GenerationRequest(prompt_tokens=[1, 2, 3], max_tokens=4, sink=lambda event: None,
                                        sampling=SamplingParams(temperature=0.0), key=key, priority=priority))
    except RequestRejected as exc:
        return exc.status
    return None


def test_one_keys_flood_leaves_room_for_another_keys_request_at_its_first_try(engine):
    results = Counter(submit(engine, "flood") for _ in range(200))
    assert results == {None: 8, 429: 192}
    assert submit(engine, "person") is None
    assert submit(engine, "batch-job", "batch") is None
