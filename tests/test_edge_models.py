"""Edge cases on a tiny random-weight GGUF: no chat template, a 64-token context, arbitrary bytes out."""

from __future__ import annotations

import json
import urllib.request

import openai
import pytest

from tests.servers import Proc, everycycle, free_port, ready, wait_for
from tests.tiny_gguf import write_tiny_llama

pytestmark = pytest.mark.system  # every test here starts processes or loads the model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    model = write_tiny_llama(d / "tiny-random.gguf", n_ctx=64)
    port = free_port()
    proc = Proc(everycycle("serve", "--port", str(port), "--model", str(model), "--threads", "1", "--workers", "1",
                           "--parallel", "2", "--run-dir", str(d)), d / "serve.log")
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: ready(base), 60, "the tiny-model server", proc)
        yield base, openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=60)
    finally:
        proc.stop()


def test_model_id_comes_from_the_file_name(tiny):
    _, client = tiny
    assert [m.id for m in client.models.list().data] == ["tiny-random"]


def test_chat_without_a_template_falls_back_to_chatml_and_survives_random_bytes(tiny):
    _, client = tiny
    r = client.chat.completions.create(model="tiny-random", messages=[{"role": "user", "content": "hi"}],
                                       max_tokens=5, temperature=1.0, seed=11)
    assert isinstance(r.choices[0].message.content, str)
    assert r.usage.completion_tokens >= 1


def test_streamed_random_bytes_are_valid_utf8_json_chunks(tiny):
    base, _ = tiny
    body = json.dumps({"model": "tiny-random", "prompt": "abc", "max_tokens": 40, "temperature": 1.5, "seed": 3,
                       "stream": True}).encode()
    req = urllib.request.Request(base + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        raw = r.read()
    events = [e for e in raw.decode("utf-8").split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    texts = [json.loads(e[6:])["choices"][0]["text"] for e in events[:-1]]
    assert "".join(texts)  # some text came out, and every chunk parsed


def test_generation_stops_at_the_end_of_the_context(tiny):
    _, client = tiny
    # Chat has no default max_tokens: the budget is whatever the context has left.
    for seed in range(5):
        r = client.chat.completions.create(model="tiny-random", messages=[{"role": "user", "content": "hi"}],
                                           temperature=1.0, seed=seed)
        if r.choices[0].finish_reason == "length":
            break
    assert r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens + r.usage.completion_tokens == 64


def test_small_context_limits_are_stated(tiny):
    _, client = tiny
    with pytest.raises(openai.BadRequestError) as exc:
        client.completions.create(model="tiny-random", prompt="x" * 100, max_tokens=1)
    assert exc.value.body["param"] == "prompt" and "64" in exc.value.body["message"]
    # max_tokens is a ceiling: past what the 64-token context leaves, the answer ends where the context does.
    cut = client.completions.create(model="tiny-random", prompt="abc", max_tokens=63)
    assert cut.usage.total_tokens <= 64
    assert cut.choices[0].finish_reason == "stop" or cut.usage.total_tokens == 64  # "length": at the context's end


def test_n_beyond_the_parallel_sequences_is_refused(tiny):
    _, client = tiny
    with pytest.raises(openai.BadRequestError) as exc:
        client.completions.create(model="tiny-random", prompt="abc", max_tokens=2, n=3)
    assert exc.value.body["param"] == "n"
