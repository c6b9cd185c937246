"""The engine's pure parts, without a model: stop strings, step planning, logprobs, metrics text."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

import pytest

from host_runtime.engine.metrics import EngineMetrics, Histogram
from host_runtime.engine.sampling import token_logprobs
from host_runtime.engine.step_plan import last_cut, next_cut, plan_step
from host_runtime.placement.matmul_rows import RowBounds
from host_runtime.engine.stop_matcher import StopMatcher


def feed_all(matcher: StopMatcher, pieces: list[str]) -> tuple[str, bool]:
    out = ""
    for piece in pieces:
        text, hit = matcher.feed(piece)
        out += text
        if hit:
            return out, True
    return out + matcher.flush(), False


@pytest.mark.parametrize("pieces,stops,expected,hit", [
    (["Hello", " wor", "ld"], ["world"], "Hello ", True),
    (["a", "b", "c"], [], "abc", False),
    (["ab", "<|im", "_end|>", "tail"], ["<|im_end|>"], "ab", True),
    (["ab", "<|im", "x"], ["<|im_end|>"], "ab<|imx", False),   # held back, then released when it diverges
    (["x", "END"], ["END", "STOP"], "x", True),
    (["xST", "OP!"], ["END", "STOP"], "x", True),
    (["aa", "a"], ["aaaa"], "aaa", False),                    # a held prefix is real output at the end
])
def test_stop_matcher(pieces, stops, expected, hit):
    assert feed_all(StopMatcher(stops), pieces) == (expected, hit)


def test_stop_matcher_never_emits_part_of_a_stop():
    m = StopMatcher(["STOP"])
    assert m.feed("abcS") == ("abc", False)
    assert m.feed("T") == ("", False)
    assert m.feed("OP") == ("", True)


@dataclass
class FakeSeq:
    seq_id: int
    prompt: list[int]
    n_past: int = 0
    next_token: int | None = None
    chunk: int = 16
    boundaries: frozenset = frozenset()
    draft: tuple = ()

    def next_cut(self, pos=None):
        return next_cut(self.prompt, self.n_past if pos is None else pos, self.chunk, self.boundaries)

    def is_prefilling(self):
        return self.n_past < len(self.prompt)

    def pending_tokens(self):
        if self.is_prefilling():
            return self.prompt[self.n_past:]
        return [self.next_token, *self.draft] if self.next_token is not None else []


def flat(calls):
    return [(p.seq.seq_id, len(p.tokens), p.start_pos, p.wants_logits) for call in calls for p in call]


def test_decoders_go_first_in_their_own_call_and_prefill_is_chunked():
    decoding = [FakeSeq(i, [1, 2], n_past=2, next_token=9) for i in range(3)]
    long_prompt = FakeSeq(7, list(range(100)))
    calls = plan_step(decoding + [long_prompt], prefill_budget=16)
    assert [[p.seq.seq_id for p in call] for call in calls] == [[0, 1, 2], [7]]
    assert all(len(p.tokens) == 1 and p.wants_logits for p in calls[0])
    assert flat(calls[1:]) == [(7, 16, 0, False)]  # a whole chunk: more prompt to come, no logits


def test_chunks_are_cut_at_fixed_multiples_whatever_the_budget_left():
    # A prompt resumed mid-chunk (after a cache hit, say) first runs up to the next boundary.
    seq = FakeSeq(0, list(range(50)), n_past=5)
    assert flat(plan_step([seq], prefill_budget=16)) == [(0, 11, 5, False)]
    seq.n_past = 48
    assert flat(plan_step([seq], prefill_budget=16)) == [(0, 2, 48, True)]


def test_a_step_always_advances_one_prompt_and_never_overtakes():
    a, b, c = FakeSeq(0, list(range(30))), FakeSeq(1, list(range(30))), FakeSeq(2, list(range(3)))
    # a's chunk fills the budget; b may not go, and c (which would fit) may not overtake b.
    assert flat(plan_step([a, b, c], prefill_budget=16)) == [(0, 16, 0, False)]
    # A budget of two chunks goes to a first (first come, first served): its whole prompt, one call a chunk, in
    # order; b's first chunk does not fit what is left, and c still may not overtake b.
    calls = plan_step([a, b, c], prefill_budget=32)
    assert [flat([call]) for call in calls] == [[(0, 16, 0, False)], [(0, 14, 16, True)]]
    # With room after a's prompt, b's first chunk shares the first round's call (equal lengths).
    calls = plan_step([a, b, c], prefill_budget=48)
    assert [flat([call]) for call in calls] == [[(0, 16, 0, False), (1, 16, 0, False)], [(0, 14, 16, True)]]


def test_calls_stay_below_the_row_count_where_the_models_kernels_change():
    # K-quants: llama.cpp's tiled kernels from 8 rows (placement/matmul_rows.py). Ten decoding sequences: calls of
    # 7 and 3 rows, each token computed as a lone token is; prompt chunks of 3 tokens: two a call (6 rows), of 16:
    # any number (a chunk alone is already past the bound).
    tiled = RowBounds(bounds=(8,))
    decoding = [FakeSeq(i, [1, 2], n_past=2, next_token=9) for i in range(10)]
    assert [len(call) for call in plan_step(decoding, prefill_budget=16, rows=tiled)] == [7, 3]
    assert [len(call) for call in plan_step(decoding, prefill_budget=16)] == [10]
    drafted = [FakeSeq(i, [1, 2], n_past=2, next_token=9, draft=(5, 6)) for i in range(4)]  # 3 rows each
    assert [len(call) for call in plan_step(drafted, prefill_budget=16, rows=tiled)] == [2, 2]
    short = [FakeSeq(i, [1, 2, 3]) for i in range(5)]
    assert [len(call) for call in plan_step(short, prefill_budget=64, rows=tiled)] == [2, 2, 1]
    long = [FakeSeq(i, list(range(16))) for i in range(3)]
    assert [len(call) for call in plan_step(long, prefill_budget=64, rows=tiled)] == [3]
    # F16 matrices (tinyBLAS, its tiles by the call's shape): a call a sequence
    alone = RowBounds(alone=True)
    assert [len(call) for call in plan_step(decoding[:3], prefill_budget=16, rows=alone)] == [1, 1, 1]
    assert [len(call) for call in plan_step(short, prefill_budget=64, rows=alone)] == [1] * 5


def test_a_calls_sequences_are_in_ascending_ids_whatever_order_they_came_in():
    # Slots are reused, so the running order drifts from the ids; llama.cpp splits a call with a KV stream per
    # sequence at every id out of ascending order (another pass over the weights each): bench/serving.py c=16 saw
    # its 16-sequence decode calls take 1.2x their time in order.
    decoding = [FakeSeq(i, [1, 2], n_past=2, next_token=9) for i in (5, 0, 3, 1, 2)]
    assert [[p.seq.seq_id for p in call] for call in plan_step(decoding, prefill_budget=16)] == [[0, 1, 2, 3, 5]]
    tiled = RowBounds(bounds=(4,))  # three rows a call: the lowest ids together
    assert [[p.seq.seq_id for p in call] for call in plan_step(decoding, prefill_budget=16, rows=tiled)] == \
        [[0, 1, 2], [3, 5]]
    prompts = [FakeSeq(i, list(range(16))) for i in (4, 2, 3)]
    assert [[p.seq.seq_id for p in call] for call in plan_step(prompts, prefill_budget=64)] == [[2, 3, 4]]


def test_calls_hold_equal_token_counts_per_sequence():
    a, b = FakeSeq(0, list(range(20)), n_past=16), FakeSeq(1, list(range(40)))
    calls = plan_step([a, b], prefill_budget=64)
    # round 0: a's last 4 tokens and b's first chunk (unequal: two calls), then b's next chunks in order
    assert [[(p.seq.seq_id, len(p.tokens), p.start_pos) for p in call] for call in calls] == \
        [[(0, 4, 16)], [(1, 16, 0)], [(1, 16, 16)], [(1, 8, 32)]]


def test_prompts_are_also_cut_after_message_ends():
    END = 2
    prompt = [1, 5, 5, 5, END, 9, 1, 7, 7] + list(range(100, 130))
    seq = FakeSeq(0, prompt, chunk=16, boundaries=frozenset({END}))
    cuts = []
    while seq.n_past < len(prompt):
        cuts.append(seq.next_cut())
        seq.n_past = cuts[-1]
    assert cuts == [5, 16, 32, len(prompt)]
    assert last_cut(prompt, 15, 16, {END}) == 5 and last_cut(prompt, 16, 16, {END}) == 16
    assert last_cut(prompt, 4, 16, {END}) == 0


def test_an_image_is_never_cut_by_a_chunk_or_a_cache_point():
    """#58: an image's places (tokens from the vocabulary's end up: engine/projector.py) go into one call whole,
    however long, and a prefix the cache could resume stops before an image, never inside it."""
    V = 1000  # the vocabulary's size: placeholders from here up
    image = [V + 7 + j for j in range(20)]  # longer than a chunk
    prompt = [1, 2, 3] + image + [4, 5, 6] + image[:4] + list(range(10, 40))
    cuts, pos = [], 0
    while pos < len(prompt):
        pos = next_cut(prompt, pos, 16, frozenset(), media_from=V)
        cuts.append(pos)
    assert cuts == [3, 23, 26, 30, 32, 48, len(prompt)]  # before, the whole image, text, the second image whole
    assert next_cut(prompt, 0, 16, frozenset()) == 16  # without the rule, a chunk would cut the image
    for upto in range(4, 23):  # inside the first image: back to its start
        assert last_cut(prompt, upto, 16, frozenset(), media_from=V) == (3 if upto >= 16 else 0)
    assert last_cut(prompt, 32, 16, frozenset(), media_from=V) == 32
    assert last_cut(prompt, 31, 16, frozenset(), media_from=V) == 3  # 16 is inside the image: its start


def test_token_logprobs_match_a_softmax():
    logits = np.array([2.0, 1.0, 0.5, -1.0], dtype=np.float32)
    chosen, top = token_logprobs(logits, 1, 2)
    probs = np.exp(logits) / np.exp(logits).sum()
    assert math.isclose(chosen, math.log(probs[1]), rel_tol=1e-6)
    assert [t for t, _ in top] == [0, 1]
    assert math.isclose(top[0][1], math.log(probs[0]), rel_tol=1e-6)
    assert token_logprobs(logits, 3, 0)[1] == []


def test_histogram_buckets_are_cumulative():
    h = Histogram((0.1, 1.0))
    for v in (0.05, 0.5, 0.7, 3.0):
        h.observe(v)
    from host_runtime.common.prometheus_text import exposition
    from host_runtime.common.prometheus_text import parse_prometheus

    lines = parse_prometheus(exposition(lambda: [h.family("x", "help")]))
    assert lines['x_bucket{le="0.1"}'] == 1 and lines['x_bucket{le="1.0"}'] == 3 and lines['x_bucket{le="+Inf"}'] == 4
    assert lines["x_count"] == 4


def test_metrics_text_has_types_and_the_kv_ratio():
    m = EngineMetrics()
    m.set_queue(2, 5, 100, 400)
    m.add("tokens_predicted_total", 7)
    text = m.render("model-x", "ready")
    assert "# TYPE everycycle_tokens_predicted_total counter" in text
    assert 'everycycle_tokens_predicted_total{model="model-x"} 7' in text
    assert 'everycycle_requests_deferred{model="model-x"} 5' in text
    assert 'everycycle_kv_cache_usage_ratio{model="model-x"} 0.25' in text
    assert 'everycycle_model_info{model="model-x",state="ready"} 1' in text
    assert 'everycycle_time_to_first_token_seconds_bucket{le="0.01",model="model-x"} 0' in text
    # Readers that key by name (the console, the benchmark) leave the model label out.
    from host_runtime.common.prometheus_text import parse_prometheus

    assert parse_prometheus(text)["everycycle_tokens_predicted_total"] == 7


def test_speculation_counters_carry_the_drafting_kind():
    m = EngineMetrics()
    m.speculated("ngram", 8, 6)
    m.speculated("ngram", 4, 0)
    text = m.render("model-x", "ready")
    assert 'everycycle_spec_draft_tokens_total{kind="ngram",model="model-x"} 12.0' in text
    assert 'everycycle_spec_accepted_tokens_total{kind="ngram",model="model-x"} 6.0' in text
    assert 'everycycle_spec_acceptance_ratio{kind="ngram",model="model-x"} 0.5' in text


def test_mixed_batches_plan_one_call_a_step_holding_decode_tokens_and_prompt_chunks():
    decoding = [FakeSeq(i, [1, 2], n_past=2, next_token=9) for i in range(3)]
    a, b = FakeSeq(5, list(range(20)), n_past=16), FakeSeq(6, list(range(40)))
    calls = plan_step(decoding + [a, b], prefill_budget=64, invariant=False)
    # Decode tokens first, then each prompt's part of the step as one slice, unequal counts together: one pass
    # over the weights for the whole step.
    assert flat(calls) == [(0, 1, 2, True), (1, 1, 2, True), (2, 1, 2, True), (5, 4, 16, True), (6, 40, 0, True)]
    assert len(calls) == 1
    assert plan_step([FakeSeq(0, [1], n_past=1)], prefill_budget=8, invariant=False) == []


def test_a_draft_is_verified_in_its_sequences_decode_slice_equal_lengths_sharing_a_call():
    drafted = [FakeSeq(i, [1, 2], n_past=2, next_token=9, draft=(4, 5, 6)) for i in range(2)]
    plain = FakeSeq(2, [1, 2], n_past=2, next_token=9)
    prompt = FakeSeq(7, list(range(40)))
    calls = plan_step(drafted + [plain, prompt], prefill_budget=16)
    # Invariant: a KV stream per sequence, so each call holds one slice length (llama.cpp would split it).
    assert [flat([c]) for c in calls] == [[(0, 4, 2, True), (1, 4, 2, True)], [(2, 1, 2, True)], [(7, 16, 0, False)]]
    assert calls[0][0].tokens == [9, 4, 5, 6]
    mixed = plan_step(drafted + [plain, prompt], prefill_budget=16, invariant=False)
    assert len(mixed) == 1 and flat(mixed) == flat(calls)


def test_one_token_calls_use_every_thread_unless_told_otherwise():
    from host_runtime.placement.llama_params import context_params

    assert [context_params(n_ctx_per_seq=256, n_parallel=2, n_batch=64, n_threads=n, batch_invariant=True).n_threads
            for n in (1, 2, 16)] == [1, 2, 16]
    cparams = context_params(n_ctx_per_seq=256, n_parallel=2, n_batch=64, n_threads=4, batch_invariant=True)
    assert (cparams.n_threads, cparams.n_threads_batch) == (4, 4)
    cparams = context_params(n_ctx_per_seq=256, n_parallel=2, n_batch=64, n_threads=4, batch_invariant=True,
                             n_threads_decode=2)
    assert (cparams.n_threads, cparams.n_threads_batch) == (2, 4)
    options = _engine_sees("serve", "--threads", "4", "--decode-threads", "2", "--speculation", "ngram")
    assert (options.context.n_threads, options.context.n_threads_decode) == (4, 2)
    assert options.speculation.enabled and options.speculation.kind == "ngram" and options.context.speculation


def _engine_sees(*argv):
    """The settings an engine process reads from its stdin when `serve` starts with these options."""
    from host_runtime.cli import build_parser, engine_options
    from host_runtime.engine.options import EngineOptions

    parser = build_parser()
    args = parser.parse_args(list(argv))
    return EngineOptions.from_json(engine_options(parser, args, None).to_json())


@pytest.mark.parametrize("argv, message", [
    (["--speculation", "draft"], "--speculation draft: needs --draft-model PATH"),
    (["--draft-model", "x.gguf"], "--draft-model: drafts only with --speculation draft"),
    (["--speculation", "draft", "--draft-model", "/nonexistent/d.gguf"], "--draft-model: model file"),
    (["--speculation", "ngram", "--draft-max", "16"], "--draft-max: must be at most 15, got 16"),
    (["--speculation", "ngram", "--draft-max", "0"], "--draft-max: must be at least 1, got 0"),
    (["--speculation", "draft", "--draft-model", "x.gguf", "--draft-p-min", "1"],
     "--draft-p-min: must be at least 0 and below 1, got 1"),
    (["--speculation", "ngram", "--draft-p-min", "0.5"], "--draft-p-min: applies only to --speculation draft"),
])
def test_draft_model_flags_are_checked_before_anything_starts(argv, message, capsys):
    from host_runtime.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["serve", "--placement", "cpu", *argv])
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_the_draft_model_reaches_the_engine_and_models_loaded_on_demand_run_without_it(tmp_path):
    from host_runtime.engine.model import default_model_path

    draft = str(default_model_path())  # a real GGUF: the path is checked as --model's
    options = _engine_sees("serve", "--speculation", "draft", "--draft-model", draft, "--prefix-cache-dir", "/run/pc",
                           "--draft-max", "12")
    assert options.speculation.kind == "draft" and options.speculation.enabled and options.draft_model == draft
    assert options.speculation.k_max == 12 and options.speculation.cost_aware  # no --draft-always
    assert _engine_sees("serve", "--speculation", "ngram", "--draft-always").speculation.cost_aware is False
    assert options.speculation.p_min == 0.0
    confident = _engine_sees("serve", "--speculation", "draft", "--draft-model", draft, "--draft-p-min", "0.25")
    assert confident.speculation.p_min == 0.25
    other = options.for_on_demand("/store/other.gguf")
    assert other.model == "/store/other.gguf" and other.draft_model is None
    assert not other.speculation.enabled and not other.context.speculation
    assert confident.for_on_demand("/store/other.gguf").speculation.p_min == 0.0  # else its engine would refuse it
    assert other.prefix_cache.directory == "/run/pc-models/other"
    assert options.speculation.kind == "draft" and options.prefix_cache.directory == "/run/pc"  # left as they were


def test_engine_options_cross_to_the_engine_as_themselves_and_a_bad_document_is_refused(tmp_path, monkeypatch, capsys):
    import io

    from host_runtime.cli import main
    from host_runtime.engine.model import ContextConfig
    from host_runtime.engine.options import EngineOptions, OptionsError, PrefixCacheConfig
    from host_runtime.engine.readiness import WedgePolicy
    from host_runtime.engine.speculation import SpeculationConfig

    full = EngineOptions("/m.gguf", ContextConfig(n_ctx_per_seq=8192, tensor_split=(0.25, 0.75), n_gpu_layers=10,
                                                  main_gpu=None, batch_invariant=False),
                         PrefixCacheConfig(ram_bytes=1 << 20, directory="/pc"),
                         SpeculationConfig(enabled=True, k_max=6), None, "/run/governor.json", WedgePolicy(floor_s=5))
    assert EngineOptions.from_json(full.to_json()) == full
    for bad, said in (("{}", "model: Field required"), ("[]", "(document)"), ("not json", "Invalid JSON"),
                      ('{"model": "/m.gguf", "context": {"n_parallel": "ten"}}', "context.n_parallel"),
                      ('{"model": "/m.gguf", "context": {"n_paralel": 4}}', "context.n_paralel: unknown field"),
                      ('{"model": "/m.gguf", "wedge": {"floor_s": 5, "ceiling_s": 9}}', "wedge.ceiling_s")):
        with pytest.raises(OptionsError, match=re.escape(said)):
            EngineOptions.from_json(bad)
    # a field left out takes its default: what a newer field reads as from an older writer
    assert EngineOptions.from_json('{"model": "/m.gguf"}') == EngineOptions("/m.gguf")
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b'{"model": 1}')))
    with pytest.raises(SystemExit) as exc:
        main(["engine", "--socket", str(tmp_path / "e.sock"), "--options-stdin"])
    assert exc.value.code == 2 and "--options-stdin: not an engine options document" in capsys.readouterr().err
    assert not (tmp_path / "e.sock").exists()  # refused before listening
