"""Prefix cache tiers against the real model: hits from context, RAM and disk give the miss's output."""

from __future__ import annotations

import queue

import pytest

from host_runtime.engine.engine import Engine, GenerationRequest, PrefixCacheConfig
from host_runtime.engine.model import ContextConfig, LoadedModel, default_model_path
from host_runtime.engine.sampling import SamplingParams

pytestmark = pytest.mark.system  # every test here starts processes or loads the model

SYSTEM = ("You are the assistant of a small bakery. You answer questions about bread, opening hours, "
          "allergens and prices, politely and briefly. ") * 6  # ~170 tokens: several 32-token chunks
QUESTION = "Question: when do you open on Sundays? Answer:"
OTHER = "A completely different prompt about the weather in the mountains, to take the only slot. " * 3


@pytest.fixture(scope="module")
def model():
    return LoadedModel(default_model_path(), ContextConfig(n_ctx_per_seq=1024, n_parallel=1, n_batch=32,
                                                           prefill_chunk=32, n_threads=2))


def ask(engine: Engine, model, text: str) -> str:
    sink: queue.Queue = queue.Queue()
    engine.submit(GenerationRequest(prompt_tokens=model.tokenize(text, add_bos=False, special=False), max_tokens=24,
                                    sink=sink.put, sampling=SamplingParams(temperature=0.0)))
    out = ""
    while (event := sink.get(timeout=120)).type != "done":
        assert event.type != "error", event
        out += getattr(event, "text", "")
    return out


def make_engine(model, **cache) -> Engine:
    engine = Engine(model, prefix_cache=PrefixCacheConfig(**cache))
    engine.start()
    return engine


@pytest.fixture(scope="module")
def miss_answer(model):
    engine = make_engine(model, enabled=False)
    try:
        return ask(engine, model, SYSTEM + QUESTION)
    finally:
        engine.stop()


def test_context_hit_gives_the_miss_output(model, miss_answer):
    engine = make_engine(model)
    try:
        assert ask(engine, model, SYSTEM + QUESTION) == miss_answer
        assert engine.cache.hits["context"] == 0
        assert ask(engine, model, SYSTEM + QUESTION) == miss_answer
        assert engine.cache.hits["context"] == 1
        assert engine.metrics.snapshot()["prompt_tokens_cached_total"] >= 160
    finally:
        engine.stop()


def test_a_next_turn_quoting_the_answer_reuses_it_and_gives_the_miss_output():
    """With more than one slot the default model computes a row alike in any call (shape_blind: per-row flash
    attention), so a slot keeps the answer it generated: the next turn, which quotes it, computes only what
    follows, and answers as a miss does. (One slot runs plain attention: cut points, as above.)"""
    model = LoadedModel(default_model_path(), ContextConfig(n_ctx_per_seq=1024, n_parallel=2, n_batch=32,
                                                            prefill_chunk=32, n_threads=2))
    engine = make_engine(model)
    try:
        assert engine.shape_blind and engine.cache.any_position
        first = model.tokenize(SYSTEM + QUESTION, add_bos=False, special=False)
        answer = ask(engine, model, SYSTEM + QUESTION)
        follow = SYSTEM + QUESTION + answer + " Question: and on Mondays? Answer:"
        cached = engine.metrics.snapshot()["prompt_tokens_cached_total"]
        again = ask(engine, model, follow)
        reused = engine.metrics.snapshot()["prompt_tokens_cached_total"] - cached
        assert len(first) + 10 < reused < len(model.tokenize(follow, add_bos=False, special=False))
    finally:
        engine.stop()
    fresh = make_engine(model, enabled=False)
    try:
        assert ask(fresh, model, follow) == again
    finally:
        fresh.stop()


def test_ram_hit_gives_the_miss_output(model, miss_answer):
    engine = make_engine(model)
    try:
        ask(engine, model, SYSTEM + QUESTION)
        ask(engine, model, OTHER)  # takes the only slot: the system prompt's KV moves to RAM
        assert len(engine.cache.ram) == 1 and engine.cache.bytes_in("ram") > 1_000_000
        assert ask(engine, model, SYSTEM + QUESTION) == miss_answer
        assert engine.cache.hits == {"context": 0, "ram": 1, "disk": 0, "running": 0}
    finally:
        engine.stop()


def spill_to_disk(model, directory) -> Engine:
    engine = make_engine(model, ram_bytes=0, directory=str(directory))
    ask(engine, model, SYSTEM + QUESTION)
    ask(engine, model, OTHER)  # no RAM budget: the prefix goes straight to disk
    engine.store.flush()
    return engine


def test_disk_hit_gives_the_miss_output(model, miss_answer, tmp_path):
    engine = spill_to_disk(model, tmp_path)
    try:
        files = list(tmp_path.glob("*.kv"))
        assert len(files) == 1 and files[0].stat().st_mode & 0o777 == 0o600
        assert ask(engine, model, SYSTEM + QUESTION) == miss_answer
        assert engine.cache.hits["disk"] == 1
    finally:
        engine.stop()


@pytest.mark.parametrize("damage", ["flip a payload byte", "truncate", "other model", "garbage"])
def test_a_damaged_file_is_detected_ignored_and_recomputed(model, miss_answer, tmp_path, damage):
    engine = spill_to_disk(model, tmp_path)
    try:
        (path,) = tmp_path.glob("*.kv")
        raw = bytearray(path.read_bytes())
        if damage == "flip a payload byte":
            raw[-100] ^= 0xFF
        elif damage == "truncate":
            raw = raw[: len(raw) // 2]
        elif damage == "other model":
            raw = raw.replace(b"SmolLM2", b"SmolLM3", 1)
        else:
            raw = bytearray(b"\x00" * 64)
        path.write_bytes(bytes(raw))
        assert ask(engine, model, SYSTEM + QUESTION) == miss_answer
        assert engine.cache.hits["disk"] == 0
        assert engine.store.corrupt_files == 1
        assert not path.exists()  # removed, never loaded again
    finally:
        engine.stop()


def test_disk_entries_survive_a_restart(model, miss_answer, tmp_path):
    spill_to_disk(model, tmp_path).stop()
    engine = make_engine(model, ram_bytes=0, directory=str(tmp_path))
    try:
        assert len(engine.cache.disk) == 1
        assert ask(engine, model, SYSTEM + QUESTION) == miss_answer
        assert engine.cache.hits["disk"] == 1
    finally:
        engine.stop()


@pytest.fixture(scope="module")
def q8_model():
    return LoadedModel(default_model_path(), ContextConfig(n_ctx_per_seq=1024, n_parallel=1, n_batch=32,
                                                           prefill_chunk=32, n_threads=2, cache_type_k="q8_0",
                                                           cache_type_v="q8_0"))


def test_with_a_q8_0_cache_hits_give_its_miss_output_and_f16_entries_are_not_its(model, q8_model, tmp_path):
    missed = make_engine(q8_model, enabled=False)
    try:
        miss = ask(missed, q8_model, SYSTEM + QUESTION)
    finally:
        missed.stop()
    engine = spill_to_disk(q8_model, tmp_path / "q8")
    try:
        assert ask(engine, q8_model, SYSTEM + QUESTION) == miss and engine.cache.hits["disk"] == 1
        ask(engine, q8_model, OTHER)
        assert ask(engine, q8_model, SYSTEM + QUESTION) == miss
    finally:
        engine.stop()
    # An F16 model's entries hold another layout: this model's cache does not take them (a miss, not garbage).
    spill_to_disk(model, tmp_path / "f16").stop()
    engine = make_engine(q8_model, ram_bytes=0, directory=str(tmp_path / "f16"))
    try:
        assert ask(engine, q8_model, SYSTEM + QUESTION) == miss and engine.cache.hits["disk"] == 0
    finally:
        engine.stop()


def test_cache_figures_reach_the_metrics_text(model):
    engine = make_engine(model)
    try:
        ask(engine, model, SYSTEM + QUESTION)
        ask(engine, model, OTHER)
        text = engine.metrics.render("m", "ready")
        assert 'everycycle_prefix_cache_bytes{model="m",tier="ram"}' in text
        assert 'everycycle_prefix_cache_hit_ratio{model="m",tier="context"}' in text
        assert 'everycycle_prefix_cache_lookups_total{model="m"} 2' in text
    finally:
        engine.stop()


def test_requests_arriving_together_compute_their_shared_prefix_once_and_answer_as_alone():
    # Agents' sessions start together on one system prompt: the second waits while the first prefills it, then
    # copies it ("running" hit), and each answer is its miss's.
    model2 = LoadedModel(default_model_path(), ContextConfig(n_ctx_per_seq=1024, n_parallel=2, n_batch=32,
                                                             prefill_chunk=32, n_threads=2))
    questions = [QUESTION, "Question: do you sell rye bread? Answer:"]
    alone = make_engine(model2, enabled=False)
    try:
        expected = [ask(alone, model2, SYSTEM + q) for q in questions]
    finally:
        alone.stop()
    engine = make_engine(model2)
    try:
        sinks = [queue.Queue(), queue.Queue()]
        for q, sink in zip(questions, sinks):
            engine.submit(GenerationRequest(prompt_tokens=model2.tokenize(SYSTEM + q, add_bos=False, special=False),
                                            max_tokens=24, sink=sink.put, sampling=SamplingParams(temperature=0.0)))
        answers = []
        for sink in sinks:
            out = ""
            while (event := sink.get(timeout=120)).type != "done":
                assert event.type != "error", event
                out += getattr(event, "text", "")
            answers.append(out)
        assert answers == expected
        prompts = [model2.tokenize(SYSTEM + q, add_bos=False, special=False) for q in questions]
        shared = engine.cache.aligned_match(prompts[0], prompts[1])  # whole 32-token chunks of the system prompt
        assert shared >= 128 and engine.cache.hits["running"] == 1 and engine.cache.tokens_reused == shared
    finally:
        engine.stop()


def test_a_second_session_copies_the_shared_prefix_and_the_first_keeps_its_conversation():
    # Two sessions on one system prompt, one after the other: the second copies the shared part from the first's
    # idle slot (a "context" hit into another slot), the first's next turn then finds its whole first turn in
    # its own slot; every answer is its miss's.
    model2 = LoadedModel(default_model_path(), ContextConfig(n_ctx_per_seq=1024, n_parallel=2, n_batch=32,
                                                             prefill_chunk=32, n_threads=2))
    first = SYSTEM + QUESTION
    turns = [first, SYSTEM + "Question: do you sell rye bread? Answer:",
             first + " We open at nine. Question: and on Mondays? Answer:"]
    alone = make_engine(model2, enabled=False)
    try:
        expected = [ask(alone, model2, t) for t in turns]
    finally:
        alone.stop()
    engine = make_engine(model2)
    try:
        assert ask(engine, model2, turns[0]) == expected[0]
        assert ask(engine, model2, turns[1]) == expected[1]
        assert engine.cache.hits["context"] == 1 and not engine.cache.ram  # copied, nothing spilled
        shared = engine.cache.tokens_reused
        assert ask(engine, model2, turns[2]) == expected[2]
        tokens = [model2.tokenize(t, add_bos=False, special=False) for t in turns]
        assert engine.cache.hits["context"] == 2
        assert engine.cache.tokens_reused - shared == engine.cache.aligned_match(tokens[0], tokens[2]) > shared
    finally:
        engine.stop()
