"""Temperature-0 output of a request is the same alone or batched with others (chunked prefill included)."""

from __future__ import annotations

import queue
import threading

import pytest

from host_runtime.engine.engine import Engine, GenerationRequest
from host_runtime.engine.model import ContextConfig, LoadedModel, default_model_path
from host_runtime.engine.prompt import PromptBuilder
from host_runtime.engine.sampling import SamplingParams
from host_runtime.placement.llama_params import f16_wide_vectors
from tests.conftest import MODEL_ID

pytestmark = pytest.mark.system  # every test here starts processes or loads the model

QUESTIONS = ["What is the capital of France?", "Name three fruits.", "Explain gravity briefly.",
             "Write a haiku about rain. " * 12]  # longer than the 96-token step budget: several chunks, several steps


# Each attention the invariant mode runs on the CPU (placement/kv_types.attention_layout): F16 asked for with short
# contexts, flash attention's per-row kernel (K stored as BF16; V too where ggml's F16 vectors are AVX512-FP16's);
# F16 with contexts over PER_ROW_MAX_CTX, plain attention; Q8_0, the per-row kernel (a quantized K).
PER_ROW_F16 = ("on", "bf16", "bf16") if f16_wide_vectors() else ("on", "bf16", "f16")
LAYOUTS = {"f16-short": ("f16", 1024, PER_ROW_F16), "f16-long": ("f16", 2304, ("off", "f16", "f16")),
           "q8_0": ("q8_0", 1024, ("on", "q8_0", "q8_0"))}


@pytest.fixture(scope="module", params=list(LAYOUTS))
def small_steps(request):
    cache_type, n_ctx, layout = LAYOUTS[request.param]
    config = ContextConfig(n_ctx_per_seq=n_ctx, n_parallel=4, n_batch=96, prefill_chunk=32, n_threads=2,
                           cache_type_k=cache_type, cache_type_v=cache_type)
    model = LoadedModel(default_model_path(), config)
    assert (model.attention.flash, model.attention.type_k, model.attention.type_v) == layout
    return model, PromptBuilder(model)


def generate(model, prompts, batch: list[int]) -> list[str]:
    engine = Engine(model)
    sinks = []
    for i in batch:
        sink: queue.Queue = queue.Queue()
        tokens, stops = prompts.chat_tokens([{"role": "user", "content": QUESTIONS[i]}])
        engine.submit(GenerationRequest(prompt_tokens=tokens, max_tokens=40, sink=sink.put, stops=stops,
                                        sampling=SamplingParams(temperature=0.0)))
        sinks.append(sink)
    engine.start()  # everything submitted first: all requests share their first steps
    texts = []
    for sink in sinks:
        text = ""
        while (event := sink.get(timeout=120)).type != "done":
            text += getattr(event, "text", "")
        texts.append(text)
    engine.stop()
    return texts


def test_batched_equals_alone_in_the_engine(small_steps):
    model, prompts = small_steps
    alone = [generate(model, prompts, [i])[0] for i in range(len(QUESTIONS))]
    together = generate(model, prompts, list(range(len(QUESTIONS))))
    assert together == alone
    assert all(alone)
    twins = generate(model, prompts, [0, 0, 0])
    assert twins == [alone[0]] * 3


def test_batched_equals_alone_through_the_api(client):
    def ask(q: str) -> str:
        return client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": q}],
                                              max_tokens=40, temperature=0).choices[0].message.content

    alone = [ask(q) for q in QUESTIONS]
    results: dict[int, str] = {}
    threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, ask(QUESTIONS[i])))
               for i in range(len(QUESTIONS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [results[i] for i in range(len(QUESTIONS))] == alone


def logprobs_of(model, prompts: list[list[int]], max_tokens: int = 12, calls: list | None = None) -> list[list[float]]:
    """The chosen tokens' logprobs of these token prompts run together (one: alone); `calls` gets each decode
    call's parts as (sequence, tokens)."""
    engine = Engine(model)
    if calls is not None:
        decode = engine.runner.decode
        engine.runner.decode = lambda parts: (calls.append([(p[0], len(p[2])) for p in parts]), decode(parts))[1]
    sinks = []
    for tokens in prompts:
        sink: queue.Queue = queue.Queue()
        engine.submit(GenerationRequest(prompt_tokens=tokens, max_tokens=max_tokens, sink=sink.put,
                                        sampling=SamplingParams(temperature=0.0, top_logprobs=0, ignore_eos=True)))
        sinks.append(sink)
    engine.start()
    out = []
    for sink in sinks:
        values = []
        while (event := sink.get(timeout=120)).type != "done":
            if event.type == "token" and event.logprob:
                values.append(event.logprob.logprob)
        out.append(values)
    engine.stop()
    return out


def chat(prompts, text: str) -> list[int]:
    return prompts.chat_tokens([{"role": "user", "content": text}])[0]


def test_a_long_context_gives_the_same_logits_alone_or_batched(small_steps):
    # Past 256 tokens a sequence sees 512 KV cells or more: there llama.cpp's CPU flash attention with F16 K and V
    # takes another path for a call's only sequence than for several (a split over the cells, summed in another
    # order), and a request's logprobs differed alone and batched. The invariant mode never runs that pair.
    model, prompts = small_steps
    long_text = "Summarise this: " + "The river valley was settled by farmers who grew barley. " * 26
    assert len(prompts.chat_tokens([{"role": "user", "content": long_text}])[0]) > 300
    alone = logprobs_of(model, [chat(prompts, long_text)])[0]
    together = logprobs_of(model, [chat(prompts, long_text), chat(prompts, QUESTIONS[1])])[0]
    assert len(alone) == 12 and together == alone


def test_decode_tokens_and_prompt_chunks_share_a_call_where_every_row_computes_alike():
    # The default model's matrices (Q4_1, Q8_0) compute a row alike at any row count and its attention is per
    # row here: a step is one call, as llama-server's (one pass over the weights, where separate decode and
    # prompt calls were two or three: bench/serving.py at 32 clients), and every row still as alone.
    config = ContextConfig(n_ctx_per_seq=1024, n_parallel=4, n_batch=96, prefill_chunk=32, n_threads=2)
    model = LoadedModel(default_model_path(), config)
    assert model.shape_blind and model.attention.per_row
    builder = PromptBuilder(model)
    prompts = [chat(builder, q) for q in QUESTIONS]  # the last over the 96-token budget: several steps
    alone = [logprobs_of(model, [p], 24)[0] for p in prompts]
    calls: list = []
    together = logprobs_of(model, prompts, 24, calls)
    assert all(len(a) == 24 for a in alone)
    assert together == alone
    joined = [c for c in calls if any(n == 1 for _, n in c) and any(n > 1 for _, n in c)]
    assert joined, calls  # decode tokens and a prompt's chunk in one call
    assert all([s for s, _ in c] == sorted(s for s, _ in c) for c in calls)


# Weight types whose CPU kernels change with a call's row count (placement/matmul_rows.py): a K-quant's tiled
# kernels from 8 rows (and Q4_K's repacked gemm from 4), F16's tinyBLAS from 2. Without the bounds all ten
# sequences' logprobs differed from their own alone, on both models. A small random-weight llama
# (256 wide: K-quant rows are 256 long) quantized by llama.cpp itself; its byte vocabulary and large logits make
# a greedy answer wander, so rows computed otherwise change the answers' logprobs at once.
@pytest.fixture(scope="module", params=["q4_k_m", "f16"])
def model_with_row_kernels(request, tmp_path_factory):
    from tests.tiny_gguf import quantized, write_tiny_llama

    d = tmp_path_factory.mktemp("rows")
    source = write_tiny_llama(d / "f32.gguf", n_ctx=512, n_embd=256, n_layer=2, n_head=4, n_ff=512)
    path = quantized(source, d / f"{request.param}.gguf", request.param)
    config = ContextConfig(n_ctx_per_seq=256, n_parallel=10, n_batch=96, prefill_chunk=32, n_threads=2)
    return request.param, LoadedModel(path, config)


def test_ten_sequences_decode_as_each_alone_whatever_the_weight_types(model_with_row_kernels):
    ftype, model = model_with_row_kernels
    # the rule the engine keeps for these types: 3 rows a decode call (Q4_K repacked for this CPU, else 7 for the
    # tiled kernels), or 1 (F16)
    assert model.row_bounds.decode_rows() == {"q4_k_m": 3 if model.weights_repacked else 7, "f16": 1}[ftype]
    prompts = [[1] + [3 + (7 * s + 11 * i) % 256 for i in range(5 + 3 * s)] for s in range(10)]
    alone = [logprobs_of(model, [p], 16)[0] for p in prompts]
    together = logprobs_of(model, prompts, 16)
    assert all(len(a) == 16 for a in alone)
    assert together == alone
    # Prompts of one length (37: a 32-token chunk, then 5) prefill together: their chunks join where each keeps
    # its own chunk's kernels (the 32s, 128 rows), and not where it would not (the 5s: a repacked gemm's group
    # and a row apart alone, all in the gemm joined)
    same_length = [[1] + [3 + (13 * s + 5 * i) % 256 for i in range(36)] for s in range(8)]
    assert logprobs_of(model, same_length) == [logprobs_of(model, [p])[0] for p in same_length]
