"""Every endpoint, streamed and not, through the official openai client against a real server."""

from __future__ import annotations

import json
import math

import pytest

from tests.conftest import MODEL_ID
from tests.servers import http_get, metric_value

pytestmark = pytest.mark.system  # every test here starts processes or loads the model

QUESTION = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]


def test_models_lists_the_served_model(client):
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL_ID]


def test_chat_completion_returns_real_tokens_with_usage(client):
    r = client.chat.completions.create(model=MODEL_ID, messages=QUESTION, max_tokens=32, temperature=0, seed=7)
    choice = r.choices[0]
    assert choice.message.role == "assistant"
    assert "Paris" in choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens > 10
    assert 0 < r.usage.completion_tokens <= 32
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_chat_is_deterministic_at_temperature_zero(client):
    a = client.chat.completions.create(model=MODEL_ID, messages=QUESTION, max_tokens=24, temperature=0, seed=1)
    b = client.chat.completions.create(model=MODEL_ID, messages=QUESTION, max_tokens=24, temperature=0, seed=1)
    assert a.choices[0].message.content == b.choices[0].message.content


def test_sampling_with_a_fixed_seed_repeats(client):
    kwargs = dict(model=MODEL_ID, prompt="The weather today is", max_tokens=16, temperature=1.0, top_p=0.9, seed=42)
    assert client.completions.create(**kwargs).choices[0].text == client.completions.create(**kwargs).choices[0].text


def test_max_tokens_gives_finish_reason_length(client):
    r = client.completions.create(model=MODEL_ID, prompt="Count: one, two, three,", max_tokens=3, temperature=0)
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 3


def test_max_completion_tokens_is_honoured(client):
    r = client.chat.completions.create(model=MODEL_ID, messages=QUESTION, max_completion_tokens=2, temperature=0)
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 2


def test_chat_stream_matches_non_stream_and_reports_usage(client):
    full = client.chat.completions.create(model=MODEL_ID, messages=QUESTION, max_tokens=24, temperature=0)
    chunks = list(client.chat.completions.create(model=MODEL_ID, messages=QUESTION, max_tokens=24, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [full.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens


def test_completion_stream(client):
    kwargs = dict(model=MODEL_ID, prompt="The three primary colours are", max_tokens=12, temperature=0)
    full = client.completions.create(**kwargs)
    chunks = list(client.completions.create(**kwargs, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == full.choices[0].text
    assert chunks[-1].choices[0].finish_reason == "length"


def test_sse_wire_format_ends_with_done(server, api_key):
    import urllib.request

    body = json.dumps({"model": MODEL_ID, "prompt": "Hi", "max_tokens": 2, "stream": True}).encode()
    req = urllib.request.Request(server + "/v1/completions", data=body,
                                 headers={"Authorization": f"Bearer {api_key[1]}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        assert r.headers["Content-Type"].startswith("text/event-stream")
        raw = r.read().decode()
    events = [e for e in raw.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"


def test_stop_string_ends_generation_and_is_not_returned(client):
    free = client.completions.create(model=MODEL_ID, prompt="1, 2, 3, 4, 5, 6, 7,", max_tokens=12, temperature=0)
    assert " 9" in free.choices[0].text
    r = client.completions.create(model=MODEL_ID, prompt="1, 2, 3, 4, 5, 6, 7,", max_tokens=12, temperature=0,
                                  stop=[" 9", "never-there"])
    assert r.choices[0].finish_reason == "stop"
    assert " 9" not in r.choices[0].text
    assert free.choices[0].text.startswith(r.choices[0].text)


def test_n_returns_that_many_choices(client):
    r = client.chat.completions.create(model=MODEL_ID, messages=QUESTION, max_tokens=8, temperature=0.9, seed=3, n=3)
    assert sorted(c.index for c in r.choices) == [0, 1, 2]
    assert all(c.message.content for c in r.choices)
    assert 3 <= r.usage.completion_tokens <= 3 * 8


def test_chat_logprobs(client):
    r = client.chat.completions.create(model=MODEL_ID, messages=QUESTION, max_tokens=5, temperature=0,
                                       logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for entry in content:
        assert entry.logprob <= 0
        assert len(entry.top_logprobs) == 3
        # Greedy: the chosen token is the most likely one.
        assert math.isclose(entry.logprob, entry.top_logprobs[0].logprob, abs_tol=1e-4)
    assert "".join(e.token for e in content) == r.choices[0].message.content


def test_completion_logprobs(client):
    r = client.completions.create(model=MODEL_ID, prompt="Hello, my name is", max_tokens=4, temperature=0, logprobs=2)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
    assert all(len(t) <= 2 for t in lp.top_logprobs)
    assert lp.text_offset[0] == 0


def test_penalties_are_accepted_and_change_output(client):
    kwargs = dict(model=MODEL_ID, prompt="the the the the the", max_tokens=16, temperature=0)
    plain = client.completions.create(**kwargs).choices[0].text
    penalised = client.completions.create(**kwargs, frequency_penalty=2.0, presence_penalty=2.0).choices[0].text
    assert plain != penalised


def test_response_format_json_object(client):
    r = client.chat.completions.create(
        model=MODEL_ID, messages=[{"role": "user", "content": "Give me a JSON object describing a cat."}],
        max_tokens=60, temperature=0, response_format={"type": "json_object"})
    text = r.choices[0].message.content
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(text), dict)
    else:  # cut by max_tokens: still a prefix of a JSON object
        assert text.lstrip().startswith("{")


def test_response_format_json_schema(client):
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"]}
    r = client.chat.completions.create(
        model=MODEL_ID, messages=[{"role": "user", "content": "Invent a person."}], max_tokens=60, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": schema}})
    assert r.choices[0].finish_reason == "stop"
    doc = json.loads(r.choices[0].message.content)
    assert set(doc) == {"name", "age"} and isinstance(doc["age"], int)


def test_embeddings_float_and_base64(client):
    r = client.embeddings.create(model=MODEL_ID, input=["hello world", "the cat sat on the mat"])
    assert [d.index for d in r.data] == [0, 1]
    dims = len(r.data[0].embedding)
    assert dims == 576  # SmolLM2-135M's hidden size
    assert math.isclose(sum(x * x for x in r.data[0].embedding), 1.0, rel_tol=1e-3)
    assert r.usage.prompt_tokens > 4
    # The openai client asks for base64 unless told otherwise; both must give the same vectors.
    f = client.embeddings.create(model=MODEL_ID, input="hello world", encoding_format="float")
    assert all(math.isclose(a, b, abs_tol=1e-5) for a, b in zip(f.data[0].embedding, r.data[0].embedding))


def test_similar_texts_embed_closer(client):
    r = client.embeddings.create(model=MODEL_ID, input=["I love cats", "I adore kittens", "Quarterly tax filing"],
                                 encoding_format="float")
    a, b, c = (d.embedding for d in r.data)
    dot = lambda x, y: sum(p * q for p, q in zip(x, y))  # noqa: E731
    assert dot(a, b) > dot(a, c)


def test_health_needs_no_key_and_reports_engine(server):
    status, body = http_get(server + "/health")
    health = json.loads(body)
    assert status == 200 and {k: health[k] for k in ("status", "engine")} == {"status": "ok", "engine": "ready"}


def test_metrics_expose_the_everycycle_set(server, client):
    client.completions.create(model=MODEL_ID, prompt="Hi", max_tokens=2)
    status, body = http_get(server + "/metrics")
    text = body.decode()
    assert status == 200
    for name in ("everycycle_requests_processing", "everycycle_requests_deferred", "everycycle_prompt_tokens_total",
                 "everycycle_tokens_predicted_total", "everycycle_time_to_first_token_seconds_bucket",
                 "everycycle_time_per_output_token_seconds_bucket"):
        assert name in text
    predicted = metric_value(text, "everycycle_tokens_predicted_total")
    assert predicted >= 2


def test_exactly_one_process_maps_the_weights(server):
    import psutil

    from host_runtime.engine.model import default_model_path

    weights = str(default_model_path().resolve())
    master = psutil.Process(server.proc.popen.pid)
    family = [master, *master.children(recursive=True)]
    assert len(family) >= 4  # master, two HTTP workers, the engine
    holders = [p for p in family if any(m.path == weights for m in p.memory_maps(grouped=True))]
    assert len(holders) == 1
    assert "engine" in " ".join(holders[0].cmdline())


def test_logit_bias_moves_the_greedy_choice(client):
    a = client.chat.completions.create(model=MODEL_ID, messages=QUESTION, temperature=0, max_tokens=8)
    banned = {str(i): -100 for i in range(0, 300)}  # every id below 300: punctuation, letters, common pieces
    b = client.chat.completions.create(model=MODEL_ID, messages=QUESTION, temperature=0, max_tokens=8,
                                       logit_bias=banned)
    assert a.choices[0].message.content != b.choices[0].message.content


def test_banning_the_end_token_runs_to_max_tokens(client):
    # SmolLM2's end-of-generation tokens are <|endoftext|> (0) and <|im_end|> (2).
    r = client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "Say hi."}],
                                       temperature=0, max_tokens=40, logit_bias={"0": -100, "2": -100})
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 40


def test_health_without_a_key_says_only_that_it_is_up(server, api_key):
    """/health passes plain HTTP to anyone on the LAN: without a key it showed the version, the slot and why the
    last update failed (hardening #35, item 9). With a key (or from the box itself) it still does."""
    _, key = api_key
    status, body = http_get(server + "/health")
    assert status == 200 and json.loads(body) == {"status": "ok", "engine": "ready"}
    status, body = http_get(server + "/health", key=key)
    assert set(json.loads(body)["system"]) == {"version", "slot", "last_update"}
    status, body = http_get(server + "/health", key="ec-not-a-key")
    assert status == 200 and "system" not in json.loads(body)  # a wrong key is not an error here, nor a key
