"""The scheduler (engine/engine.py) against a fake runner (tests/fake_runner.py): admission and order, the queue's
bound, cancellation, chunked prefill beside running streams, finishing (end of generation, stop strings,
max_tokens, the context's end), several choices, the prefix cache's actions, speculation, and failures that must
stay one request's. No llama.cpp, no model: each runs in milliseconds (tests/test_scheduler.py keeps the real
runner honest)."""

from __future__ import annotations

import threading

import pytest

from host_runtime.engine import wire
from host_runtime.engine.engine import Engine, GenerationRequest
from host_runtime.engine.errors import RequestRejected
from host_runtime.engine.sampling import SamplingParams
from host_runtime.engine.wire import PRIORITIES
from host_runtime.engine.speculation import SpeculationConfig
from host_runtime.engine.step_plan import PrefillBudget
from tests.fake_runner import EOG, FakeModel, FakeRunner

WAIT_S = 10


class Events:
    """Every request's events, in the global order the loop produced them."""

    def __init__(self):
        self.log: list[tuple[str, object]] = []
        self.lock = threading.Lock()
        self.finished: dict[str, threading.Event] = {}

    def sink(self, name: str):
        self.finished[name] = threading.Event()

        def put(event):
            with self.lock:
                self.log.append((name, event))
            if isinstance(event, wire.FINAL):
                self.finished[name].set()
        return put

    def of(self, name: str) -> list:
        with self.lock:
            return [e for n, e in self.log if n == name]

    def text(self, name: str, index: int = 0) -> str:
        return "".join(e.text for e in self.of(name) if isinstance(e, wire.Token) and e.index == index)

    def wait(self, *names: str) -> None:
        for name in names:
            assert self.finished[name].wait(WAIT_S), f"{name} never finished"


@pytest.fixture
def make():
    engines = []

    def build(model: FakeModel | None = None, runner_kw: dict | None = None, **engine_kw):
        model = model or FakeModel()
        runner = FakeRunner(model, **(runner_kw or {}))
        engine = Engine(model, runner=runner, **engine_kw)
        engines.append(engine)
        return engine, runner
    yield build
    for engine in engines:
        engine.stop()


def ask(engine: Engine, events: Events, name: str, prompt: str, max_tokens: int = 8, **kw) -> GenerationRequest:
    sampling = kw.pop("sampling", SamplingParams(temperature=0.0))
    request = GenerationRequest(prompt_tokens=list(prompt.encode()), max_tokens=max_tokens, sink=events.sink(name),
                                sampling=sampling, **kw)
    engine.submit(request)
    return request


def test_a_generation_streams_tokens_then_finishes_with_its_counts(make):
    engine, runner = make()
    events = Events()
    engine.start()
    ask(engine, events, "a", "abc", max_tokens=5)
    events.wait("a")
    got = events.of("a")
    assert events.text("a") == "defgh"
    assert got[-2] == wire.Finish(0, "length", 5, None) and got[-1] == wire.Done(3, 0)
    assert runner.threads == {"engine-loop"}  # every llama.cpp call from the loop thread
    # A call of generated tokens only is counted apart from prompt calls (bench/serving.py's call profile): the
    # prompt in one call, then one call a generated token but the last (which ends the request unfed).
    figures = engine.metrics.snapshot()
    assert figures["n_decode_generated_total"] == figures["n_busy_slots_generated_total"] == 4
    assert figures["n_decode_total"] == 5


def test_waiting_requests_are_served_in_arrival_order(make):
    engine, _ = make(FakeModel(n_parallel=2))
    events = Events()
    names = [f"r{i}" for i in range(5)]
    for name in names:  # all waiting before the loop starts
        ask(engine, events, name, "xyz", max_tokens=4)
    engine.start()
    events.wait(*names)
    finished = [n for n, e in events.log if isinstance(e, wire.Done)]
    # Two slots: r0 and r1 run together, then r2 and r3, then r4.
    assert sorted(finished[:2]) == ["r0", "r1"] and sorted(finished[2:4]) == ["r2", "r3"] and finished[4] == "r4"
    assert all(events.text(n) == "abcd" for n in names)  # after a non-letter the model says 'a'


def test_a_full_queue_refuses_at_once_with_retry_after(make):
    engine, _ = make(FakeModel(n_parallel=1), max_waiting=1)
    events = Events()
    ask(engine, events, "waits", "abc")
    with pytest.raises(RequestRejected) as err:
        ask(engine, events, "refused", "abc")
    assert (err.value.status, err.value.code, err.value.retry_after) == (503, "queue_full", 2)
    assert err.value.error_type == "server_busy"
    assert engine.metrics.snapshot()["requests_rejected_total"] == 1


def test_more_choices_than_sequences_is_a_400_naming_n(make):
    engine, _ = make(FakeModel(n_parallel=2))
    with pytest.raises(RequestRejected) as err:
        ask(engine, Events(), "many", "abc", n=3)
    assert err.value.status == 400 and err.value.param == "n"


def test_a_cancelled_request_frees_its_sequence_and_its_cells(make):
    import time

    def slow(history):  # a token a millisecond: the cancel lands mid-generation
        time.sleep(0.001)
        return ord("a")
    engine, runner = make(FakeModel(n_parallel=1, n_ctx_per_seq=8192), runner_kw={"next_token": slow})
    events = Events()
    engine.start()
    running = ask(engine, events, "long", "abc", max_tokens=5000)
    waiting = ask(engine, events, "next", "xyz", max_tokens=3)
    while len(events.of("long")) < 3:
        assert not events.finished["next"].is_set()
        threading.Event().wait(0.001)
    decodes_at_cancel = engine.metrics.snapshot()["n_decode_total"]
    running.cancel()
    events.wait("next")  # it got the only sequence
    assert engine.metrics.snapshot()["requests_cancelled_total"] == 1
    # Freed within a step: at most the call in flight, then only the next request's (3 prompt tokens, 3 tokens).
    assert engine.metrics.snapshot()["n_decode_total"] - decodes_at_cancel <= 1 + 3
    assert not any(isinstance(e, wire.FINAL) for e in events.of("long"))  # a cancelled request is not answered
    assert engine.cache.free_slots() == 1 and waiting.cached_tokens == 0
    assert all(c.closed for c in runner.chains)


def test_a_long_prompt_is_prefilled_in_chunks_while_a_stream_keeps_moving(make):
    engine, runner = make(FakeModel(n_parallel=2, prefill_budget=16, prefill_chunk=16, n_ctx_per_seq=512))
    events = Events()
    ask(engine, events, "stream", "a", max_tokens=60)
    ask(engine, events, "long", "q" * 200, max_tokens=2)
    engine.start()  # both admitted at once (started first, the fake's stream could end before the prompt came)
    events.wait("long", "stream")
    order = [n for n, e in events.log if isinstance(e, wire.Token)]
    first_long = order.index("long")
    # 200 prompt tokens at 16 a step: 13 steps before its first token, each after the first moved the stream
    assert 12 <= order[:first_long].count("stream") < 60
    chunks = [p for call in runner.calls for p in call if len(p[2]) > 1]
    assert all(len(tokens) <= 16 and start % 16 == 0 for _, start, tokens, _ in chunks)



@pytest.mark.parametrize("step_prefill_s, most_chunks_a_step", [(1e-9, 1), (100.0, 4)])
def test_while_a_stream_decodes_a_steps_prompt_calls_stop_at_the_time_budget(make, step_prefill_s,
                                                                              most_chunks_a_step):
    """The step's prompt budget by time, not tokens (#61): an answer waited for four 128-token chunks a step
    (about 8 s at 15,000 tokens of context); now for what the last prompt call's speed computes in
    step_prefill_s, at least one chunk. Here every call takes longer than 1e-9 s (one chunk a step while the
    stream decodes) and none 100 s (the token budget's four chunks)."""
    engine, runner = make(FakeModel(n_parallel=2, prefill_budget=64, prefill_chunk=16, n_ctx_per_seq=512),
                          step_prefill_s=step_prefill_s)
    events = Events()
    ask(engine, events, "stream", "a", max_tokens=80)
    ask(engine, events, "long", "q" * 200, max_tokens=2)
    engine.start()  # both admitted at once: the stream decodes from its second step on, the long prompt prefills
    events.wait("long", "stream")
    # the long prompt's chunks between two of the stream's decode calls
    runs, run = [], 0
    for call in runner.calls:
        if any(len(tokens) > 1 for _, _, tokens, _ in call):
            run += 1
        elif run:
            runs.append(run)
            run = 0
    # the first step's (no sequence decodes yet: the token budget) aside
    assert len(runs) > 1 and max(runs[1:]) == most_chunks_a_step
    order = [n for n, e in events.log if isinstance(e, wire.Token)]
    assert order[:order.index("long")].count("stream") >= (10 if most_chunks_a_step == 1 else 2)


def test_the_prefill_budget_follows_the_last_prompt_calls_speed_while_a_sequence_decodes():
    budget = PrefillBudget(512, target_s=0.5)
    assert budget.tokens(decoding=True) == 512  # nothing measured yet: the token budget
    budget.prompt_call_took(128, 0.128)  # 1 ms a token: 500 of them in half a second
    assert budget.tokens(decoding=True) == 500 and budget.tokens(decoding=False) == 512
    budget.prompt_call_took(128, 2.0)  # a long context: 15.6 ms a token
    assert budget.tokens(decoding=True) == 32
    budget.prompt_call_took(128, 100.0)
    assert budget.tokens(decoding=True) == 1  # at least a token: plan_step then takes one whole chunk
    budget.prompt_call_took(128, 0.001)
    assert budget.tokens(decoding=True) == 512  # never past the token budget
    budget.prompt_call_took(0, 1.0)  # nothing to learn from
    assert budget.tokens(decoding=True) == 512

def test_end_of_generation_stops_unless_ignored(make):
    def stops_after_c(history):
        return EOG if history[-1] == ord("c") else (history[-1] + 1)

    engine, _ = make(runner_kw={"next_token": stops_after_c})
    events = Events()
    engine.start()
    ask(engine, events, "eog", "a", max_tokens=10)
    ask(engine, events, "ignored", "a", max_tokens=4, sampling=SamplingParams(temperature=0.0, ignore_eos=True))
    events.wait("eog", "ignored")
    assert events.text("eog") == "bc" and events.of("eog")[-2] == wire.Finish(0, "stop", 3, None)
    assert events.of("ignored")[-2].finish_reason == "length" and events.of("ignored")[-2].completion_tokens == 4


def test_a_stop_string_ends_the_choice_and_is_not_sent(make):
    engine, _ = make()
    events = Events()
    engine.start()
    ask(engine, events, "s", "a", max_tokens=20, stops=["efg"])
    events.wait("s")
    finish = events.of("s")[-2]
    assert events.text("s") == "bcd" and finish.finish_reason == "stop" and finish.stop_string == "efg"


def test_the_context_end_finishes_with_length(make):
    engine, _ = make(FakeModel(n_ctx_per_seq=32))
    events = Events()
    engine.start()
    assert engine.check_fits(20, None, "prompt") == 12  # no max_tokens: what the context leaves
    assert engine.check_fits(20, 32000, "prompt") == 12 and engine.check_fits(20, 5, "prompt") == 5  # a ceiling
    for n_prompt in (32, 40):
        with pytest.raises(RequestRejected) as err:
            engine.check_fits(n_prompt, 1, "messages")
        assert err.value.code == "context_length_exceeded" and err.value.param == "messages"
        assert f"the prompt is {n_prompt} tokens" in err.value.message and "holds 32 tokens" in err.value.message
    ask(engine, events, "c", "a" * 20, max_tokens=100)
    events.wait("c")
    assert events.of("c")[-2].finish_reason == "length" and len(events.text("c")) == 12  # 20 + 12 = the context


def test_several_choices_each_finish_then_one_done(make):
    engine, runner = make(FakeModel(n_parallel=2))
    events = Events()
    engine.start()
    ask(engine, events, "n2", "abc", max_tokens=3, n=2)
    events.wait("n2")
    got = events.of("n2")
    assert events.text("n2", 0) == events.text("n2", 1) == "def"
    assert sorted(e.index for e in got if isinstance(e, wire.Finish)) == [0, 1]
    assert isinstance(got[-1], wire.Done) and sum(isinstance(e, wire.Done) for e in got) == 1
    assert len(runner.chains) == 2  # a chain of its own per choice


def test_a_repeated_prompt_reuses_the_cached_prefix_and_answers_the_same(make):
    engine, runner = make(FakeModel(n_parallel=1, prefill_chunk=16))
    events = Events()
    engine.start()
    prompt = "m" * 40 + "abc"
    ask(engine, events, "cold", prompt, max_tokens=4)
    events.wait("cold")
    ask(engine, events, "other", "z" * 40, max_tokens=2)  # takes the only slot: the first prefix spills to RAM
    events.wait("other")
    ask(engine, events, "warm", prompt, max_tokens=4)
    events.wait("warm")
    assert events.text("warm") == events.text("cold") == "defg"
    assert events.of("cold")[-1].cached_tokens == 0
    assert events.of("warm")[-1].cached_tokens == 32  # whole chunks of the shared prefix
    assert engine.cache.hits["ram"] == 1
    # The trace's phases (wire.Timings): where each prefix came from
    assert events.of("cold")[-1].timings.cache_hit == "" and events.of("warm")[-1].timings.cache_hit == "ram"


def test_done_says_where_the_time_went_waiting_prefilling_and_decoding(make):
    engine, _ = make(FakeModel(n_parallel=1), runner_kw={"next_token": _slow})
    events = Events()
    for name in ("first", "second"):  # both waiting before the loop starts: the second waits for the first's slot
        ask(engine, events, name, "xyz", max_tokens=30)
    engine.start()
    events.wait("first", "second")
    first, second = (events.of(n)[-1].timings for n in ("first", "second"))
    # 30 tokens at a millisecond each (_slow): the second's wait is the first's whole answer
    assert first.decode_s >= 0.025 and second.queued_s >= first.decode_s
    assert first.queued_s < second.queued_s and first.preemptions == second.preemptions == 0
    assert all(t.prefill_s >= 0 and t.restore_s >= 0 and t.parked_s == 0 for t in (first, second))


def test_a_prefix_the_runner_cannot_restore_is_recomputed(make):
    engine, runner = make(FakeModel(n_parallel=1, prefill_chunk=16))
    runner.restore = lambda seq_id, data: (runner.forget(seq_id), False)[1]
    events = Events()
    engine.start()
    prompt = "m" * 40 + "abc"
    for name in ("cold", "other", "again"):
        ask(engine, events, name, prompt if name != "other" else "z" * 40, max_tokens=4)
        events.wait(name)
    assert events.text("again") == events.text("cold") and events.of("again")[-1].cached_tokens == 0


def test_prefixes_are_reused_only_within_their_scope(make):
    from host_runtime.engine.prefix_cache import scope_marker

    engine, _ = make(FakeModel(n_parallel=2, prefill_chunk=16))
    events = Events()
    engine.start()
    prompt = "m" * 40 + "abc"
    ask(engine, events, "team-a", prompt, max_tokens=2, cache_scope=scope_marker("a"))
    events.wait("team-a")
    ask(engine, events, "team-b", prompt, max_tokens=2, cache_scope=scope_marker("b"))
    events.wait("team-b")
    ask(engine, events, "team-a-again", prompt, max_tokens=2, cache_scope=scope_marker("a"))
    events.wait("team-a-again")
    assert events.of("team-b")[-1].cached_tokens == 0 and events.of("team-a-again")[-1].cached_tokens == 32


def test_prompt_lookup_drafts_are_verified_and_the_output_is_the_same(make):
    spec = SpeculationConfig(enabled=True, kind="ngram", cost_aware=False)
    prompt = "abcdefghijklmnopqrstuvwxyz" * 2
    plain, _ = make(FakeModel(n_ctx_per_seq=512))
    drafted, runner = make(FakeModel(n_ctx_per_seq=512), speculation=spec)
    events = Events()
    for engine, name in ((plain, "plain"), (drafted, "drafted")):
        engine.start()
        ask(engine, events, name, prompt, max_tokens=40)
        events.wait(name)
    assert events.text("drafted") == events.text("plain") == ("abcdefghijklmnopqrstuvwxyz" * 2)[:40]
    spec_calls = [p for call in runner.calls for p in call if p[3] == 0 and len(p[2]) > 1]
    assert spec_calls, "no draft went out"
    assert len(runner.calls) < 40  # accepted drafts: fewer calls than tokens


def test_a_rejected_draft_leaves_no_cells_behind(make):
    spec = SpeculationConfig(enabled=True, kind="ngram", cost_aware=False)

    def diverges(history):  # the prompt says 'x' follows 'abc'; the model says 'd'
        return history[-1] + 1 if history[-1] < ord("z") else ord("a")
    engine, runner = make(FakeModel(n_ctx_per_seq=512), runner_kw={"next_token": diverges}, speculation=spec)
    events = Events()
    engine.start()
    ask(engine, events, "s", "abcxyzabcxyzabcxyz" + "abc", max_tokens=6)
    events.wait("s")
    assert events.text("s") == "defghi"  # the fake asserts every call continues the cells exactly


def test_a_failed_admission_errors_that_request_only(make):
    engine, runner = make(FakeModel(n_parallel=2), runner_kw={"fail_sampler": lambda s: s.seed == 13})
    events = Events()
    engine.start()
    ask(engine, events, "ok", "abc", max_tokens=30)
    while not events.of("ok"):
        threading.Event().wait(0.001)
    ask(engine, events, "bad", "abc", sampling=SamplingParams(temperature=0.0, seed=13))
    events.wait("bad", "ok")
    assert isinstance(events.of("bad")[-1], wire.Error) and events.of("bad")[-1].error.status == 500
    assert isinstance(events.of("ok")[-1], wire.Done) and len(events.text("ok")) == 30
    assert engine.cache.free_slots() == 2


def test_a_failed_decode_fails_that_batch_and_the_engine_serves_on(make):
    failures = []

    def once(parts):
        if not failures and any(len(t) == 1 for _, _, t, _ in parts):
            failures.append(parts)
            return True
        return False
    engine, runner = make(runner_kw={"fail_decode": once})
    events = Events()
    engine.start()
    ask(engine, events, "unlucky", "abc", max_tokens=5)
    events.wait("unlucky")
    assert isinstance(events.of("unlucky")[-1], wire.Error) and events.of("unlucky")[-1].error.status == 500
    ask(engine, events, "later", "abc", max_tokens=3)
    events.wait("later")
    assert events.text("later") == "def" and engine.cache.free_slots() == 2


def test_a_grammar_the_runner_refuses_is_a_400_at_submit(make):
    engine, runner = make()
    with pytest.raises(RequestRejected) as err:
        ask(engine, Events(), "g", "abc", sampling=SamplingParams(grammar="refused"))
    assert err.value.status == 400 and err.value.param == "response_format"
    assert not runner.chains


def test_logprobs_come_with_their_tokens(make):
    engine, _ = make()
    events = Events()
    engine.start()
    ask(engine, events, "lp", "abc", max_tokens=2, sampling=SamplingParams(temperature=0.0, top_logprobs=0))
    events.wait("lp")
    tokens = [e for e in events.of("lp") if isinstance(e, wire.Token)]
    assert [t.logprob.token for t in tokens] == ["d", "e"] and all(t.logprob.logprob == -0.5 for t in tokens)


def test_embeddings_run_on_the_loop_thread_between_steps(make):
    engine, runner = make()
    events = Events()
    engine.start()
    ask(engine, events, "gen", "abc", max_tokens=20)
    vectors, n_tokens = engine.embed(["hello", "hi"])
    events.wait("gen")
    assert vectors == [[1.0, 0.0], [1.0, 0.0]] and n_tokens == 7
    assert runner.threads == {"engine-loop"}
    with pytest.raises(RequestRejected) as err:
        engine.embed([""])
    assert err.value.param == "input"


def test_the_warm_up_decodes_once_and_forgets_its_cells(make):
    engine, runner = make()
    seconds = engine.start(warm_up=True)
    assert seconds is not None and seconds >= 0
    assert len(runner.calls) == 1 and runner.cells.get(0) == []


# ---- priority classes and preemption ------------------------------------------------------------------------

def _slow(history):  # a token a millisecond: the other requests arrive mid-generation
    import time

    time.sleep(0.001)
    last = history[-1]
    return ord("a") + (last - ord("a") + 1) % 26 if ord("a") <= last <= ord("z") else ord("a")


def test_the_queue_serves_by_class_then_arrival(make):
    engine, _ = make(FakeModel(n_parallel=1))
    events = Events()
    for name, priority in (("b1", "batch"), ("d1", "default"), ("i1", "interactive"), ("b2", "batch"),
                           ("i2", "interactive")):
        ask(engine, events, name, "abc", max_tokens=2, priority=priority)
    engine.start()
    events.wait("b1", "d1", "i1", "b2", "i2")
    assert [n for n, e in events.log if isinstance(e, wire.Done)] == ["i1", "i2", "d1", "b1", "b2"]
    with pytest.raises(RequestRejected) as err:
        ask(engine, events, "bad", "abc", priority="urgent")
    assert err.value.status == 400 and err.value.param == "priority"


def test_an_interactive_request_parks_a_batch_one_and_each_answers_as_if_alone(make):
    alone, _ = make(FakeModel(n_parallel=1, n_ctx_per_seq=512))
    events = Events()
    alone.start()
    ask(alone, events, "reference", "m" * 20 + "abc", max_tokens=60)
    events.wait("reference")
    engine, runner = make(FakeModel(n_parallel=1, n_ctx_per_seq=512), runner_kw={"next_token": _slow})
    engine.start()
    ask(engine, events, "batch", "m" * 20 + "abc", max_tokens=60, priority="batch")
    while len(events.of("batch")) < 10:
        threading.Event().wait(0.001)
    ask(engine, events, "chat", "xyz", max_tokens=5, priority="interactive")
    events.wait("chat", "batch")
    done = [n for n, e in events.log if isinstance(e, wire.Done) and n in ("chat", "batch")]
    assert done == ["chat", "batch"]  # the chat did not wait for the batch's 60 tokens
    assert events.text("batch") == events.text("reference") and events.of("batch")[-2].completion_tokens == 60
    assert events.text("chat") == "abcde"
    figures = engine.metrics.snapshot()
    assert figures["requests_preempted_total"] == 1 and figures["requests_resumed_total"] == 1
    assert engine.cache.free_slots() == 1 and not engine.scheduler.parked
    batch, chat = events.of("batch")[-1].timings, events.of("chat")[-1].timings
    # The batch's trace says it was parked, and for about as long as the chat took (5 tokens at a millisecond)
    assert batch.preemptions == 1 and 0.004 <= batch.parked_s <= batch.decode_s and chat.preemptions == 0


def _chat_beside_a_batch(make, adjust, batch_tokens: int) -> tuple[list[str], float]:
    """One slot: a batch request (`adjust`ed once submitted) running, then an interactive chat: which finished
    first, and how many were parked."""
    engine, _ = make(FakeModel(n_parallel=1, n_ctx_per_seq=512), runner_kw={"next_token": _slow})
    events = Events()
    engine.start()
    adjust(ask(engine, events, "batch", "abc", max_tokens=batch_tokens, priority="batch"))
    while len(events.of("batch")) < 3:
        threading.Event().wait(0.001)
    ask(engine, events, "chat", "xyz", max_tokens=3, priority="interactive")
    events.wait("batch", "chat")
    return ([n for n, e in events.log if isinstance(e, wire.Done)],
            engine.metrics.snapshot()["requests_preempted_total"])


def test_no_class_parks_its_own_nor_a_request_aged_past_it(make):
    # shut out past two classes' worth: it ranks as interactive now
    order, parked = _chat_beside_a_batch(make, lambda r: setattr(r, "shut_out_s", 2 * 60.0 + 1), 40)
    assert order == ["batch", "chat"] and parked == 0
    request = GenerationRequest(prompt_tokens=[1], max_tokens=1, sink=lambda e: None, priority="batch")
    assert request.rank() == 2
    request.shut_out_s = 61
    assert request.rank() == 1
    request.shut_out_s = 1000
    assert request.rank() == 0


def test_a_batch_job_that_has_run_for_minutes_is_still_parked_for_a_person(make):
    """Aging counts the time a request was shut out, not its age: a long job's requests wait behind each other,
    and must not all rank as interactive after two minutes (nobody could preempt them then)."""
    # sent ten minutes ago
    order, parked = _chat_beside_a_batch(make, lambda r: setattr(r, "arrived", r.arrived - 10 * 60.0), 200)
    assert order == ["chat", "batch"] and parked == 1


def test_only_a_request_that_higher_classes_alone_keep_out_ages():
    """The scheduler alone (engine/scheduler.py: no engine, no model)."""
    from types import SimpleNamespace

    from host_runtime.engine.scheduler import Scheduler

    scheduler = Scheduler(max_waiting=8, now=1000.0)

    def request(priority: str) -> GenerationRequest:
        return GenerationRequest(prompt_tokens=[1], max_tokens=1, sink=lambda e: None, priority=priority)

    running = [SimpleNamespace(request=request("batch")), SimpleNamespace(request=request("interactive"))]
    behind_its_own = request("batch")      # a batch request runs: it waits its turn in its class
    default = request("default")           # only a lower class (batch) and a higher one run: it would park the batch
    scheduler.enqueue(behind_its_own)
    scheduler.enqueue(default)
    scheduler.age(1061.0, running)
    assert behind_its_own.shut_out_s == 0 and default.shut_out_s == 0
    people = [SimpleNamespace(request=request("interactive"))] * 2  # people hold every slot
    scheduler.age(1122.0, people)
    assert behind_its_own.shut_out_s == 61 and behind_its_own.rank() == 1 and default.rank() == 0
    scheduler.age(1722.0, [])  # nothing runs (the governor holds every sequence back): nobody is passed over
    assert behind_its_own.rank() == 1


def test_the_scheduler_picks_by_class_then_arrival_and_parks_the_latest_lowest():
    """The scheduler's decisions, without an engine: the pick keeps class order within the free slots (a parked
    sequence competes with the waiting), and the preemption victim is the latest of the lowest class below."""
    from types import SimpleNamespace

    from host_runtime.engine.scheduler import Scheduler

    scheduler = Scheduler(max_waiting=8, now=0.0)

    def request(priority: str, arrived: float, n: int = 1) -> GenerationRequest:
        return GenerationRequest(prompt_tokens=[1, 2], max_tokens=1, sink=lambda e: None, priority=priority,
                                 arrived=arrived, n=n)

    batch, chat, default = request("batch", 1.0), request("interactive", 3.0), request("default", 2.0)
    for r in (batch, chat, default):
        scheduler.enqueue(r)
    parked_seq = SimpleNamespace(request=request("default", 0.5))
    scheduler.park(parked_seq, "kv", now=5.0)
    assert parked_seq.request.preemptions == 1 and parked_seq.request.parked_at == 5.0
    never_wait = lambda r, running: False  # noqa: E731 (the prefix cache's answer)
    picked = scheduler.pick(free=2, allowed=4, busy=2, free_slots=2, running=[], worth_waiting=never_wait)
    assert [getattr(p, "request", p) for p in picked] == [chat, parked_seq.request]
    assert list(scheduler.waiting) == [batch, default] and scheduler.parked == []
    # the prefix cache says a running sequence computes its prefix: it waits, the next goes
    assert scheduler.pick(1, 4, 3, 1, [], lambda r, running: r is default) == [batch]
    running = [SimpleNamespace(request=request("batch", 1.0)), SimpleNamespace(request=request("batch", 4.0)),
               SimpleNamespace(request=request("default", 0.0)), SimpleNamespace(request=request("batch", 9.0, n=2))]
    assert Scheduler.preemption_victim(running, rank=PRIORITIES.index("interactive")) is running[1]
    assert Scheduler.preemption_victim(running, rank=PRIORITIES.index("batch")) is None


def _parked_behind_a_chat(engine, events, batch: str, chat: str, *, batch_tokens: int,
                          chat_tokens: int) -> GenerationRequest:
    """A batch request running, then an interactive one that parks it: the batch request, once parked."""
    request = ask(engine, events, batch, "abc", max_tokens=batch_tokens, priority="batch")
    while len(events.of(batch)) < 3:
        threading.Event().wait(0.001)
    ask(engine, events, chat, "xyz", max_tokens=chat_tokens, priority="interactive")
    while not engine.scheduler.parked:
        threading.Event().wait(0.001)
    return request


def test_a_parked_request_cancelled_is_dropped(make):
    engine, runner = make(FakeModel(n_parallel=1, n_ctx_per_seq=4096), runner_kw={"next_token": _slow})
    events = Events()
    engine.start()
    batch = _parked_behind_a_chat(engine, events, "batch", "chat", batch_tokens=3000, chat_tokens=400)
    batch.cancel()
    events.wait("chat")
    threading.Event().wait(0.05)
    assert not engine.scheduler.parked and engine.metrics.snapshot()["requests_resumed_total"] == 0
    assert not any(isinstance(e, wire.FINAL) for e in events.of("batch"))


def test_a_key_past_its_concurrency_limit_gets_a_429_and_other_keys_do_not(make):
    engine, _ = make(FakeModel(n_parallel=1, n_ctx_per_seq=4096), runner_kw={"next_token": _slow})
    events = Events()
    engine.start()
    first = ask(engine, events, "job-1", "abc", max_tokens=3000, key="nightly", key_max_concurrent=2)
    ask(engine, events, "job-2", "abc", max_tokens=3, key="nightly", key_max_concurrent=2)  # waits: one slot
    with pytest.raises(RequestRejected) as err:
        ask(engine, events, "job-3", "abc", max_tokens=3, key="nightly", key_max_concurrent=2)
    assert (err.value.status, err.value.code, err.value.retry_after) == (429, "concurrency_limit_exceeded", 1)
    assert err.value.error_type == "rate_limit_error" and "'nightly'" in err.value.message
    ask(engine, events, "alice", "xyz", max_tokens=3, key="alice", key_max_concurrent=1)  # another key: queued
    ask(engine, events, "nobody", "xyz", max_tokens=3)  # no key, no limit
    first.cancel()
    events.wait("job-2", "alice", "nobody")
    # Answered and cancelled requests no longer count: the key has room again.
    ask(engine, events, "job-4", "abc", max_tokens=3, key="nightly", key_max_concurrent=2)
    ask(engine, events, "job-5", "abc", max_tokens=3, key="nightly", key_max_concurrent=2)
    events.wait("job-4", "job-5")
    assert not engine.scheduler.live_per_key


def test_each_keys_usage_is_counted_by_its_name(make):
    from prometheus_client.parser import text_string_to_metric_families

    engine, _ = make(FakeModel(n_parallel=2, prefill_chunk=16))
    events = Events()
    engine.start()
    prompt = "m" * 40 + "abc"
    for name in ("a1", "a2"):  # the second reuses the first's cached prefix
        ask(engine, events, name, prompt, max_tokens=4, key="alice")
        events.wait(name)
    ask(engine, events, "n1", "xyz", max_tokens=3, key="nightly")
    ask(engine, events, "anon", "xyz", max_tokens=3)  # no key: not in the per-key figures
    gone = ask(engine, events, "n2", "xyz", max_tokens=3000, key="nightly", sampling=SamplingParams(ignore_eos=True))
    gone.cancel()
    events.wait("n1", "anon")
    threading.Event().wait(0.05)
    samples = {(s.name, s.labels.get("key")): s.value for f in text_string_to_metric_families(
        engine.metrics.render("m", "ready")) for s in f.samples if s.name.startswith("everycycle_key_")}
    assert samples[("everycycle_key_requests_total", "alice")] == 2
    assert samples[("everycycle_key_prompt_tokens_total", "alice")] == 86
    assert samples[("everycycle_key_cached_prompt_tokens_total", "alice")] == 32
    assert samples[("everycycle_key_generated_tokens_total", "alice")] == 8
    assert samples[("everycycle_key_requests_total", "nightly")] == 2
    assert samples[("everycycle_key_errors_total", "nightly")] == 1  # the cancelled one
    assert samples[("everycycle_key_errors_total", "alice")] == 0
    assert {k for _, k in samples} == {"alice", "nightly"}


def test_a_parked_state_past_the_ram_bound_waits_on_disk_and_comes_back_whole(make, tmp_path):
    """Disk parking (#38): past park_ram_bytes a parked sequence's KV goes to a 0600 file beside the prefix cache's,
    counted in everycycle_parked_bytes{tier="disk"} while it waits; it resumes with the output it would have had,
    and the file is gone. One a stopped engine left is removed when the next starts; a cancelled one's at once."""
    import os

    from host_runtime.engine.options import PrefixCacheConfig

    cache = PrefixCacheConfig(directory=str(tmp_path / "prefix-cache"))
    alone, _ = make(FakeModel(n_parallel=1, n_ctx_per_seq=512))
    events = Events()
    alone.start()
    ask(alone, events, "reference", "m" * 20 + "abc", max_tokens=60)
    events.wait("reference")
    (tmp_path / "prefix-cache" / "parked").mkdir(parents=True)
    (tmp_path / "prefix-cache" / "parked" / "left-behind.parked").write_bytes(b"x")
    engine, _ = make(FakeModel(n_parallel=1, n_ctx_per_seq=512), runner_kw={"next_token": _slow}, prefix_cache=cache,
                     park_ram_bytes=0)
    parked_dir = tmp_path / "prefix-cache" / "parked"
    assert list(parked_dir.iterdir()) == []  # the last engine's leftovers
    engine.start()
    ask(engine, events, "batch", "m" * 20 + "abc", max_tokens=60, priority="batch")
    while len(events.of("batch")) < 10:
        threading.Event().wait(0.001)
    seen: list[tuple[int, list]] = []

    def watch():  # while the chat runs, the batch's state is a file
        while not any(isinstance(e, wire.Done) for e in events.of("chat")):
            modes = []
            for f in parked_dir.iterdir():
                try:
                    modes.append(oct(os.stat(f).st_mode & 0o777))
                except FileNotFoundError:  # resumed between the listing and the look: its file taken back
                    pass
            if modes:
                seen.append((engine.metrics.snapshot()["parked_bytes_disk"], modes))
            threading.Event().wait(0.0005)
    watcher = threading.Thread(target=watch)
    ask(engine, events, "chat", "xyz", max_tokens=100, priority="interactive")  # 100 ms at least, parked meanwhile
    watcher.start()
    events.wait("chat", "batch")
    watcher.join()
    # (the gauge follows the file's writing: the first looks may see it at 0)
    assert seen and any(n > 0 for n, _ in seen) and all(modes == ["0o600"] for _, modes in seen)
    assert events.text("batch") == events.text("reference")
    assert list(parked_dir.iterdir()) == [] and engine.metrics.snapshot()["parked_bytes_disk"] == 0
    assert 'everycycle_parked_bytes{model="m",tier="disk"} 0.0' in engine.metrics.render("m", "ready")
    # A parked request cancelled: its file goes with it.
    batch = _parked_behind_a_chat(engine, events, "batch2", "chat2", batch_tokens=400, chat_tokens=200)
    assert len(list(parked_dir.iterdir())) == 1
    batch.cancel()
    events.wait("chat2")
    threading.Event().wait(0.05)
    assert list(parked_dir.iterdir()) == [] and not engine.scheduler.parked
