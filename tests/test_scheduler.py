"""The scheduler with the real runner and model: chunked prefill beside running streams, mixed batches, speculation
with real logits, embeddings and the warm-up on the loop thread, grammars llama.cpp refuses. Admission, order,
the queue, cancellation and failures are tests/test_scheduler_logic.py's, against a fake runner."""

from __future__ import annotations

import json
import queue
import threading
import urllib.request

import pytest

from host_runtime.engine.engine import EmbeddingCancelled, Engine, GenerationRequest
from host_runtime.engine.errors import RequestRejected
from host_runtime.engine.model import ContextConfig, LoadedModel, default_model_path
from host_runtime.engine.sampling import SamplingParams
from host_runtime.engine.speculation import SpeculationConfig
from tests.conftest import MODEL_ID
from tests.servers import Proc, everycycle, free_port, http_get, metric_value, ready, wait_for

pytestmark = pytest.mark.system  # every test here starts processes or loads the model


def test_capacity_follows_the_kv_budget():
    from host_runtime.placement.model_table import read_table
    from host_runtime.placement.planner import PlanRequest, capacity_for

    table = read_table(default_model_path())
    per_token = table.kv_bytes_per_token()
    assert per_token == 23040  # SmolLM2-135M: 30 layers, 3 KV heads of 64, f16
    assert capacity_for(table, PlanRequest(n_ctx_per_seq=4096, kv_budget_bytes=1 << 30)) == \
        (4096, (1 << 30) // (per_token * 4096), 44)
    assert capacity_for(table, PlanRequest(n_ctx_per_seq=4096, kv_budget_bytes=1))[1] == 1  # always at least one
    assert capacity_for(table, PlanRequest(n_ctx_per_seq=128, kv_budget_bytes=1 << 40))[1] == 16  # capped
    assert capacity_for(table, PlanRequest(n_ctx_per_seq=4096, n_parallel=3, max_waiting=0)) == (4096, 3, 0)
    assert capacity_for(table, PlanRequest(n_ctx_per_seq=1 << 20))[0] == 8192  # at most the training context


@pytest.fixture(scope="module")
def model():
    return LoadedModel(default_model_path(), ContextConfig(n_ctx_per_seq=1024, n_parallel=2, n_batch=32,
                                                           prefill_chunk=32, n_threads=2))


class Log:
    """One sink for several requests, keeping the global order of events."""

    def __init__(self):
        self.events: list[tuple[str, dict]] = []
        self.lock = threading.Lock()
        self.done = {}

    def sink(self, name: str):
        self.done[name] = threading.Event()

        def put(event):
            with self.lock:
                self.events.append((name, event))
            if event.type in ("done", "error"):
                self.done[name].set()
        return put


def request(model, log: Log, name: str, prompt: str, max_tokens: int) -> GenerationRequest:
    return GenerationRequest(prompt_tokens=model.tokenize(prompt, add_bos=False, special=False), max_tokens=max_tokens,
                             sink=log.sink(name), sampling=SamplingParams(temperature=0.0, ignore_eos=True))


def stream_beside_a_long_prompt(model) -> dict:
    """A stream runs; a ~400-token prompt arrives. What happened between its arrival and its first token: the
    stream's tokens there, the prompt's chunk count, and the engine's decode calls."""
    engine = Engine(model, max_waiting=8)
    log = Log()
    engine.start()
    engine.submit(request(model, log, "stream", "1, 2, 3, 4,", 120))
    wait_for(lambda: sum(1 for n, e in log.events if n == "stream" and e.type == "token") >= 3, 60,
             "the stream to start")
    long_prompt = "The history of the river valley begins long before written records. " * 30  # ~400 tokens
    n_chunks = -(-len(model.tokenize(long_prompt, add_bos=False, special=False)) // model.prefill_chunk)
    calls: dict[str, float] = {}
    long_request = request(model, log, "long", long_prompt, 2)
    put = long_request.sink

    def sink(event):
        if event.type == "token" and "first_token" not in calls:
            calls["first_token"] = engine.metrics.snapshot()["n_decode_total"]
        put(event)

    long_request.sink = sink
    with log.lock:
        submitted_at = len(log.events)
        calls["submitted"] = engine.metrics.snapshot()["n_decode_total"]
    engine.submit(long_request)
    assert log.done["long"].wait(120) and log.done["stream"].wait(120)
    engine.stop()
    order = [(n, e.type) for n, e in log.events]
    first_long = order.index(("long", "token"))
    return {"n_chunks": n_chunks, "calls": calls["first_token"] - calls["submitted"],
            "stream_tokens": sum(1 for n, t in order[submitted_at:first_long] if n == "stream" and t == "token")}


@pytest.fixture(scope="module")
def plain_attention():
    """Past PER_ROW_MAX_CTX tokens a sequence the invariant mode takes plain attention, whose rows move with the
    call's shape: its steps keep decode tokens and prompt chunks in separate calls."""
    return LoadedModel(default_model_path(), ContextConfig(n_ctx_per_seq=2304, n_parallel=2, n_batch=32,
                                                           prefill_chunk=32, n_threads=2))


def test_a_long_prompt_does_not_stop_running_streams(model, plain_attention):
    for loaded, one_call_a_step in ((model, True), (plain_attention, False)):
        assert loaded.shape_blind is one_call_a_step
        seen = stream_beside_a_long_prompt(loaded)
        # Between the long request's arrival and its first token, the stream got a token in every
        # step: one per prefill chunk (the chunk is the most it ever waits).
        n_chunks = seen["n_chunks"]
        tokens_during_prefill = seen["stream_tokens"]
        assert n_chunks >= 10
        assert tokens_during_prefill >= n_chunks - 1
        if one_call_a_step:  # every row computes alike in any call: the stream's token and a chunk share one
            assert seen["calls"] <= tokens_during_prefill + 2
        else:  # the stream's tokens and the prompt's chunks in separate calls, two a step (see the mixed test)
            assert seen["calls"] > tokens_during_prefill + 2


def test_queue_full_is_503_with_retry_after_over_http(tmp_path):
    port = free_port()
    proc = Proc(everycycle("serve", "--port", str(port), "--parallel", "1", "--max-queue", "1", "--threads", "2",
                           "--workers", "1", "--ctx-size", "2048", "--run-dir", str(tmp_path)), tmp_path / "s.log")
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: ready(base), 60, "server", proc)

        def post(body: dict):
            req = urllib.request.Request(base + "/v1/completions", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
            return urllib.request.urlopen(req, timeout=120)

        def metric(name):
            return metric_value(http_get(base + "/metrics")[1].decode(), name)

        # The holder must keep its slot through the test: its end tokens are banned (SmolLM2's <|endoftext|>
        # and <|im_end|>, 0 and 2), or a sampled end could free the slot before the second request queues.
        holder = post({"model": MODEL_ID, "prompt": "1, 2, 3,", "max_tokens": 1500, "stream": True,
                       "logit_bias": {"0": -100, "2": -100}})
        holder.readline()
        wait_for(lambda: metric("everycycle_requests_processing") == 1, 10, "the slot to be taken")
        waiting: queue.Queue = queue.Queue()
        threading.Thread(target=lambda: waiting.put(json.loads(post(
            {"model": MODEL_ID, "prompt": "Hello", "max_tokens": 3}).read())), daemon=True).start()
        wait_for(lambda: metric("everycycle_requests_deferred") == 1, 10, "the second request to queue")
        with pytest.raises(urllib.error.HTTPError) as exc:
            post({"model": MODEL_ID, "prompt": "Hello", "max_tokens": 3})
        assert exc.value.code == 503
        assert int(exc.value.headers["Retry-After"]) > 0
        body = json.loads(exc.value.read())["error"]
        assert body["code"] == "queue_full" and body["type"] == "server_busy"
        holder.close()  # the queued request now gets the slot
        assert waiting.get(timeout=60)["choices"][0]["finish_reason"] == "length"
    finally:
        proc.stop()


def test_a_grammar_llama_cpp_refuses_never_reaches_a_sampler_chain(model):
    """llama_sampler_init_grammar returns NULL for a repetition past its limit, an undefined rule, a syntax error or
    left recursion; before, that NULL went into the chain and the engine crashed on the first token."""
    from host_runtime.engine.sampling import CompiledGrammar, GrammarRejected, SamplingParams, build_sampler_chain

    CompiledGrammar(model.model, 'root ::= "a"{1,20}').close()
    engine = Engine(model)
    for refused in ('root ::= "a"{2500}', "root ::= undefined-rule", "root ::= (", 'root ::= x\nx ::= x "a"'):
        with pytest.raises(GrammarRejected):
            CompiledGrammar(model.model, refused)
        with pytest.raises(GrammarRejected):  # a chain never parses: it takes only a compiled grammar
            build_sampler_chain(model.model, SamplingParams(grammar=refused))
        with pytest.raises(RequestRejected) as err:  # refused at submit, on the caller's thread
            engine.submit(GenerationRequest(prompt_tokens=[1, 2], max_tokens=2, sink=lambda e: None,
                                            sampling=SamplingParams(grammar=refused)))
        assert err.value.status == 400


def test_embeddings_stop_when_their_client_leaves(model):
    engine = Engine(model)
    engine.start()
    try:
        with pytest.raises(EmbeddingCancelled):
            engine.embed(["one", "two"], cancelled=lambda: True)
        # The loop goes on to the next request.
        vectors, _ = engine.embed(["one"])
    finally:
        engine.stop()
    assert len(vectors) == 1


def test_embedding_waiters_are_bounded(model):
    """Embeddings wait for one context: past the queue's bound they are refused at once (503), not queued."""
    engine = Engine(model, max_waiting=0)
    with pytest.raises(RequestRejected) as exc:
        engine.embed(["one"])
    assert exc.value.status == 503 and exc.value.code == "queue_full"


def test_mixed_batches_make_one_call_a_step_and_streams_still_move_during_a_long_prompt():
    # serve --mixed-batches: the running stream's token and the prompt's chunk share one llama_decode, so a step
    # that prefills costs one pass over the weights, not two.
    mixed = LoadedModel(default_model_path(), ContextConfig(n_ctx_per_seq=1024, n_parallel=2, n_batch=32,
                                                            prefill_chunk=32, n_threads=2, batch_invariant=False))
    seen = stream_beside_a_long_prompt(mixed)
    n_chunks, stream_tokens = seen["n_chunks"], seen["stream_tokens"]
    assert n_chunks >= 10 and stream_tokens >= n_chunks - 1
    # One call per step: as many calls as the stream got tokens (a step or so of slack at either end); the
    # invariant mode makes two per step here.
    assert seen["calls"] <= stream_tokens + 2


EDIT_PROMPT = ("Here is a Python file:\n\n```python\ndef load(path):\n    with open(path) as f:\n        rows = "
               "json.load(f)\n    return [Bicycle(row['owner'], row['size']) for row in rows]\n\n\ndef save(path, "
               "bicycles):\n    rows = [{'owner': b.owner, 'size': b.size} for b in bicycles]\n    with open(path, "
               "'w') as f:\n        json.dump(rows, f)\n```\n\nRename Bicycle to Bike. Reply with the whole "
               "edited file.")


@pytest.fixture(scope="module")
def spec_model():
    """The model as serve --speculation loads it: attention laid out so that a draft's rows compute as one."""
    return LoadedModel(default_model_path(), ContextConfig(n_ctx_per_seq=1024, n_parallel=2, n_batch=32,
                                                           prefill_chunk=32, n_threads=2, speculation=True))


@pytest.mark.parametrize("cache_type", ["f16", "q8_0"])
def test_a_drafts_rows_give_the_logits_one_token_at_a_time_gives(spec_model, cache_type):
    """Up to 16 tokens of one sequence in one call (a draft verified) against the same tokens decoded one per
    call, past 400 cells: bit-identical. (Plain attention gave logits 0.47 to 1.1 apart here: llamafile's
    tinyBLAS takes its matrix products from two rows, vec_dot one.) F16 asked for (K stored as BF16) and Q8_0:
    flash attention's per-row kernel, whatever the call's rows."""
    import llama_cpp
    import numpy as np
    from llama_cpp._internals import LlamaBatch

    from host_runtime.engine.prompt import PromptBuilder

    m = spec_model if cache_type == "f16" else LoadedModel(default_model_path(), ContextConfig(
        n_ctx_per_seq=1024, n_parallel=2, n_batch=32, prefill_chunk=32, n_threads=2, speculation=True,
        cache_type_k=cache_type, cache_type_v=cache_type))
    assert m.attention.per_row and m.attention.type_k == ("bf16" if cache_type == "f16" else cache_type)
    holder = LlamaBatch(n_tokens=m.n_batch, embd=0, n_seq_max=1, verbose=False)
    batch = holder.batch

    def decode(tokens, pos, every_row=False):
        batch.n_tokens = 0
        for i, token in enumerate(tokens):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, pos + i, 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = every_row or i == len(tokens) - 1
        batch.n_tokens = len(tokens)
        assert llama_cpp.llama_decode(m.ctx.ctx, batch) == 0
        return [np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(m.ctx.ctx, i), shape=(m.n_vocab,)).copy()
                for i in range(len(tokens)) if every_row or i == len(tokens) - 1]

    llama_cpp.llama_memory_clear(m.ctx.memory, True)
    prompt, _ = PromptBuilder(m).chat_tokens([{"role": "user", "content": EDIT_PROMPT * 3}])
    assert len(prompt) > 400
    for start in range(0, len(prompt) - 1, 32):
        decode(prompt[start:min(start + 32, len(prompt) - 1)], start)
    base = len(prompt) - 1
    tokens, one_by_one = [prompt[-1]], []
    for i in range(16):
        one_by_one.append(decode(tokens[-1:], base + i)[0])
        tokens.append(int(np.argmax(one_by_one[-1])))
    for rows in (2, 7, 16):
        llama_cpp.llama_memory_seq_rm(m.ctx.memory, 0, base, -1)
        together = decode(tokens[:rows], base, every_row=True)
        assert all(np.array_equal(a, b) for a, b in zip(together, one_by_one[:rows])), rows
    llama_cpp.llama_memory_clear(m.ctx.memory, True)


def edit(model, speculation: bool, opt_out: bool = False, drafter=None,
         cost_aware: bool = False) -> tuple[str, dict, float]:
    from host_runtime.engine.prompt import PromptBuilder

    kind = "draft" if drafter is not None else "ngram"
    # Drafting whatever it costs: these tests check the mechanism, not whether drafts pay on this machine.
    engine = Engine(model, speculation=SpeculationConfig(enabled=speculation, kind=kind, cost_aware=cost_aware),
                    drafter=drafter)
    log = Log()
    tokens, _ = PromptBuilder(model).chat_tokens([{"role": "user", "content": EDIT_PROMPT}])
    engine.submit(GenerationRequest(prompt_tokens=tokens, max_tokens=80, sink=log.sink("edit"),
                                    sampling=SamplingParams(temperature=0.0, ignore_eos=True),
                                    speculation=not opt_out))
    engine.start()
    assert log.done["edit"].wait(120)
    engine.stop()
    text = "".join(getattr(e, "text", "") for _, e in log.events if e.type == "token")
    assert sum(1 for _, e in log.events if e.type == "finish") == 1
    return text, dict(engine.metrics.spec), engine.metrics.snapshot()["n_decode_total"]


def test_speculation_drafts_from_the_prompt_and_keeps_the_output(spec_model):
    """Prompt lookup on a code edit: drafts are accepted, the same 80 tokens come in fewer decode calls, and
    the text is the one decoding without speculation gives (temperature 0)."""
    import llama_cpp

    model = spec_model

    llama_cpp.llama_memory_clear(model.ctx.memory, True)  # an earlier test's cached prefixes are not this one's
    plain, plain_spec, plain_calls = edit(model, speculation=False)
    llama_cpp.llama_memory_clear(model.ctx.memory, True)
    fast, spec, calls = edit(model, speculation=True)
    assert plain_spec == {} and fast == plain
    drafted, accepted = spec["ngram"]
    assert accepted > 20 and drafted >= accepted
    assert calls < plain_calls - 15
    llama_cpp.llama_memory_clear(model.ctx.memory, True)
    opted_out, none, _ = edit(model, speculation=True, opt_out=True)  # the request's own "speculation": false
    assert none == {} and opted_out == plain
    llama_cpp.llama_memory_clear(model.ctx.memory, True)
    # Priced by the measured cost of calls (the default): whatever lengths that chooses, the text is the same.
    priced, _, _ = edit(model, speculation=True, cost_aware=True)
    assert priced == plain


def test_a_draft_model_drafts_and_the_output_is_the_targets(spec_model):
    """The same GGUF as its own draft model (its own context, placed by the planner): its drafts are the target's
    argmax, so nearly all are accepted; the text is the one decoding without speculation gives; and the next
    request on the slot drafts from what the draft context already holds."""
    import llama_cpp

    from host_runtime.engine.draft_model import DraftModel

    model = spec_model
    config = ContextConfig(n_ctx_per_seq=1024, n_parallel=2, n_batch=32, prefill_chunk=32, n_threads=2,
                           speculation=True)
    drafter = DraftModel.load(str(default_model_path()), model, config)
    assert drafter.model.n_parallel == model.n_parallel and not drafter.model.batch_invariant
    llama_cpp.llama_memory_clear(model.ctx.memory, True)
    plain, _, plain_calls = edit(model, speculation=False)
    llama_cpp.llama_memory_clear(model.ctx.memory, True)
    text, spec, calls = edit(model, speculation=True, drafter=drafter)
    drafted, accepted = spec["draft"]
    assert text == plain
    assert accepted >= 0.9 * drafted and accepted > 40
    assert calls < plain_calls / 2
    held = {seq: len(tokens) for seq, tokens in drafter.kv.items()}
    assert max(held.values()) > 200  # the edit prompt and its answer, kept for the slot's next request
    llama_cpp.llama_memory_clear(model.ctx.memory, True)
    opted_out, none, _ = edit(model, speculation=True, opt_out=True, drafter=drafter)
    assert none == {} and opted_out == plain
    llama_cpp.llama_memory_clear(model.ctx.memory, True)
    # Left to the measured cost of calls, a draft as dear as its target drafts once (up to --draft-max), learns
    # that a drafted position costs a target call's worth, and stops: no acceptance can pay for that, so it
    # does not probe later either. (Bound: two drafts, as one call measured far slower than the rest can make
    # a second look worth it; drafting always, it drafted over 40 of these 80 tokens.)
    priced, priced_spec, _ = edit(model, speculation=True, drafter=drafter, cost_aware=True)
    drafted, _ = priced_spec["draft"]
    assert priced == plain and 0 < drafted <= 2 * SpeculationConfig().k_max


def test_a_draft_model_with_other_tokens_is_refused_naming_both(model, tmp_path):
    from host_runtime.engine.draft_model import DraftModel
    from host_runtime.engine.model import ModelLoadError
    from tests.tiny_gguf import write_tiny_llama

    tiny = tmp_path / "tiny-draft.gguf"
    write_tiny_llama(tiny, n_ctx=2048)
    config = ContextConfig(n_ctx_per_seq=1024, n_parallel=2, n_batch=32, prefill_chunk=32, n_threads=2)
    with pytest.raises(ModelLoadError) as exc:
        DraftModel.load(str(tiny), model, config)
    assert str(exc.value).startswith(f"--draft-model tiny-draft cannot draft for {model.model_id}: ")
    assert "vocabulary has" in str(exc.value) or "token" in str(exc.value)


def test_the_warm_up_and_embeddings_decode_on_the_loop_thread_that_makes_every_generation_call(model):
    """libgomp gives each calling thread its own team; a warm-up on the loading thread made every later
    two-thread one-token call about three times slower (Engine.start), and an embedding on a handler thread
    made them four times slower while that thread lived (Engine.embed). So they run on the loop thread."""
    import threading

    import llama_cpp

    engine = Engine(model)
    threads = []
    real_decode = llama_cpp.llama_decode

    def recording_decode(ctx, batch):
        threads.append(threading.current_thread().name)
        return real_decode(ctx, batch)

    llama_cpp.llama_decode = recording_decode
    try:
        seconds = engine.start(warm_up=True)
        log = Log()
        engine.submit(GenerationRequest(prompt_tokens=model.tokenize("Hello there", add_bos=True, special=False),
                                        max_tokens=3, sink=log.sink("a"),
                                        sampling=SamplingParams(temperature=0.0, ignore_eos=True)))
        assert log.done["a"].wait(60)
        n_generation = len(threads)
        vectors, _ = engine.embed(["an embedding's decode too", "and the next input's"])
    finally:
        llama_cpp.llama_decode = real_decode
        engine.stop()
    assert seconds > 0 and n_generation >= 4 and len(vectors) == 2 and len(threads) == n_generation + 2
    assert set(threads) == {"engine-loop"}


def test_a_served_draft_models_placement_is_in_the_metrics_beside_the_targets():
    from host_runtime.engine.options import EngineOptions
    from host_runtime.engine.service import EngineService

    path = str(default_model_path())
    service = EngineService(EngineOptions(path, ContextConfig(n_ctx_per_seq=512, n_parallel=1, n_batch=32,
                                                              prefill_chunk=32, n_threads=2, speculation=True),
                                          speculation=SpeculationConfig(enabled=True, kind="draft"), draft_model=path))
    service.load()
    try:
        assert service.state == "ready", service.state_reason
        text = service.metrics_text().text
    finally:
        service.engine.stop()
    assert 'everycycle_model_layers{device="CPU"} 31' in text
    assert 'everycycle_draft_model_layers{device="CPU"} 31' in text
    assert 'everycycle_draft_device_memory_allocated_bytes{device="CPU",kind="weights"}' in text
    assert text.count("everycycle_backend_info{") == 1  # the draft has no backend line of its own


def test_a_grammar_is_parsed_once_on_the_submitting_thread_and_copied_for_each_choice(model):
    """The third hardening review: a tool grammar was compiled again for each choice on the loop thread, so one
    large grammar held every stream. Now Engine.submit parses it on the caller's thread, and each choice's chain
    gets a copy of the parsed grammar (llama_sampler_clone), which still constrains it."""
    import threading

    import llama_cpp

    from host_runtime.engine.sampling import MAX_GRAMMAR_BYTES, CompiledGrammar, GrammarRejected

    engine = Engine(model)
    parses = []
    real_init = llama_cpp.llama_sampler_init_grammar

    def recording_init(vocab, grammar, root):
        parses.append(threading.current_thread().name)
        return real_init(vocab, grammar, root)

    llama_cpp.llama_sampler_init_grammar = recording_init
    try:
        engine.start()
        log = Log()
        engine.submit(GenerationRequest(prompt_tokens=model.tokenize("Say yes or no:", add_bos=True, special=False),
                                        max_tokens=8, n=2, sink=log.sink("a"),
                                        sampling=SamplingParams(temperature=1.0, seed=7,
                                                                grammar='root ::= ("yes" | "no") "."')))
        assert log.done["a"].wait(60)
    finally:
        llama_cpp.llama_sampler_init_grammar = real_init
        engine.stop()
    texts = {}
    for _, event in log.events:
        if event.type == "token":
            texts[event.index] = texts.get(event.index, "") + event.text
    assert parses == [threading.current_thread().name]
    assert sorted(texts) == [0, 1] and all(t in ("yes.", "no.") for t in texts.values()), texts
    with pytest.raises(GrammarRejected):
        CompiledGrammar(model.model, 'root ::= "' + "a" * MAX_GRAMMAR_BYTES + '"')


def test_a_parked_batch_request_resumes_with_the_output_it_would_have_had(model):
    """Preemption with the real runner: the batch request's KV cells saved by llama.cpp and restored into another
    slot, its sampler chain (and RNG) kept; its text is the same as alone, greedy and sampled with a seed."""
    def run(preempt: bool) -> dict[str, str]:
        engine = Engine(model, max_waiting=8)
        log = Log()
        engine.start()
        texts = {}
        for name, sampling in (("greedy", SamplingParams(temperature=0.0, ignore_eos=True)),
                               ("seeded", SamplingParams(temperature=0.8, seed=7, ignore_eos=True))):
            req = GenerationRequest(prompt_tokens=model.tokenize("Once upon a time", add_bos=False, special=False),
                                    max_tokens=40, sink=log.sink(name), sampling=sampling, priority="batch")
            engine.submit(req)
        if preempt:
            wait_for(lambda: sum(1 for n, e in log.events if e.type == "token") >= 10, 60, "both to be generating")
            engine.submit(request(model, log, "chat", "Hi", 8))  # the default class: above batch
        for name in ("greedy", "seeded") + (("chat",) if preempt else ()):
            assert log.done[name].wait(120)
        figures = engine.metrics.snapshot()
        engine.stop()
        for name in ("greedy", "seeded"):
            texts[name] = "".join(e.text for n, e in log.events if n == name and e.type == "token")
        if preempt:
            assert figures["requests_preempted_total"] == 1 and figures["requests_resumed_total"] == 1
            assert [n for n, e in log.events if e.type == "done"][0] == "chat"
        return texts

    assert run(preempt=True) == run(preempt=False)


def test_an_interactive_keys_request_overtakes_a_batch_keys_stream_over_http(tmp_path):
    """One sequence; the nightly job's key is batch and holds one request at a time, alice's is interactive: a
    second request of the job's key is a 429, alice's request is answered while the job's stream is parked, and
    the job's stream then goes on to its end."""
    from host_runtime.auth.keystore import create_key

    keys = tmp_path / "keys.json"
    from host_runtime.auth.keystore import set_limit

    nightly, alice = create_key(keys, "nightly", "batch"), create_key(keys, "alice", "interactive")
    set_limit(keys, "nightly", 1)
    port = free_port()
    proc = Proc(everycycle("serve", "--port", str(port), "--parallel", "1", "--threads", "2", "--workers", "1",
                           "--ctx-size", "2048", "--keys", str(keys), "--metrics-access", "open",
                           "--run-dir", str(tmp_path)), tmp_path / "s.log")
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: ready(base), 60, "server", proc)

        def post(body: dict, key: str):
            req = urllib.request.Request(base + "/v1/completions", data=json.dumps(body).encode(), headers={
                "Content-Type": "application/json", "Authorization": f"Bearer {key}"})
            return urllib.request.urlopen(req, timeout=120)

        job = post({"model": MODEL_ID, "prompt": "1, 2, 3,", "max_tokens": 120, "stream": True,
                    "logit_bias": {"0": -100, "2": -100}, "temperature": 0}, nightly)
        job.readline()
        with pytest.raises(urllib.error.HTTPError) as exc:  # the job's key holds one request at a time
            post({"model": MODEL_ID, "prompt": "Hello", "max_tokens": 3}, nightly)
        assert exc.value.code == 429 and int(exc.value.headers["Retry-After"]) >= 1
        assert json.loads(exc.value.read())["error"]["code"] == "concurrency_limit_exceeded"
        answer = json.loads(post({"model": MODEL_ID, "prompt": "Hello", "max_tokens": 3}, alice).read())
        assert answer["choices"][0]["finish_reason"] == "length"
        text = http_get(base + "/metrics")[1].decode()
        assert metric_value(text, "everycycle_requests_preempted_total") == 1
        chunks = [json.loads(line[6:]) for line in job.read().decode().splitlines()
                  if line.startswith("data: {")]
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"  # the job went on to its end
        assert metric_value(http_get(base + "/metrics")[1].decode(), "everycycle_requests_resumed_total") == 1
    finally:
        proc.stop()
