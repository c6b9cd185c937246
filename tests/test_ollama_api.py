"""Ollama's API, driven by the official `ollama` Python client against the real server (the session's: default
model, a key required, sent as Ollama clients send it: Authorization: Bearer)."""

from __future__ import annotations

import datetime
import json
import os
import urllib.request

import ollama
import pytest

from tests.conftest import MODEL_ID

pytestmark = pytest.mark.system

NAME = MODEL_ID + ":latest"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"]}}}
GREEDY = {"temperature": 0, "num_predict": 12}


@pytest.fixture(scope="module")
def client(server, api_key):
    return ollama.Client(host=server, headers={"Authorization": f"Bearer {api_key[1]}"}, timeout=120)


def test_the_model_is_listed_and_shown_with_the_context_it_is_served_at(client):
    listed = client.list()
    assert [m.model for m in listed.models] == [NAME] and listed.models[0].size > 50 << 20
    assert [m.model for m in client.ps().models] == [NAME]
    shown = client.show(NAME)
    assert shown.modelinfo["context_length"] == 2048 and shown.modelinfo["trained_context_length"] == 8192
    assert "completion" in shown.capabilities


def test_a_chat_whole_and_streamed_gives_the_same_greedy_answer(client):
    ask = [{"role": "user", "content": "Name a colour."}]
    whole = client.chat(model=NAME, messages=ask, options=GREEDY)
    assert whole.done and whole.message.role == "assistant" and whole.message.content
    assert whole.done_reason in ("stop", "length") and 1 <= whole.eval_count <= 12 and whole.prompt_eval_count > 5
    parts = list(client.chat(model=MODEL_ID, messages=ask, options=GREEDY, stream=True))  # the name without its tag
    assert parts[-1].done and not any(p.done for p in parts[:-1]) and parts[-1].eval_count == whole.eval_count
    assert "".join(p.message.content for p in parts) == whole.message.content


def test_generate_whole_and_streamed(client):
    whole = client.generate(model=NAME, prompt="The capital of France is", options=GREEDY)
    assert whole.done and whole.response
    raw = client.generate(model=NAME, prompt="The capital of France is", raw=True, options=GREEDY, stream=True)
    parts = list(raw)
    assert parts[-1].done and "".join(p.response for p in parts)


def test_format_constrains_the_answer_to_the_schema(client):
    schema = {"type": "object", "properties": {"colour": {"type": "string", "maxLength": 12}}, "required": ["colour"]}
    answer = client.chat(model=NAME, messages=[{"role": "user", "content": "Name a colour as JSON."}], format=schema,
                         options={"temperature": 0, "num_predict": 40})
    assert isinstance(json.loads(answer.message.content)["colour"], str)


def _post(server: str, key: str, path: str, body: dict) -> list[dict]:
    req = urllib.request.Request(server + path, json.dumps(body).encode(), method="POST",
                                 headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return [json.loads(line) for line in r.read().splitlines() if line.strip()]


def test_a_tool_call_comes_back_as_ollama_gives_it(client, server, api_key):
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    # Ollama has no tool_choice; EveryCycle's own field requires the call, so that the small model makes one. Its
    # answer, whole and streamed, read by the client's own response type.
    body = {"model": NAME, "messages": ask, "tools": [WEATHER], "tool_choice": "required",
            "options": {"temperature": 0, "num_predict": 60}}
    (whole,) = _post(server, api_key[1], "/api/chat", {**body, "stream": False})
    lines = [ollama.ChatResponse.model_validate(doc) for doc in _post(server, api_key[1], "/api/chat", body)]
    streamed = [c for line in lines for c in line.message.tool_calls or []]
    answer = ollama.ChatResponse.model_validate(whole)
    calls = answer.message.tool_calls or []
    assert calls and calls[0].function.name == "get_weather" and isinstance(calls[0].function.arguments, dict)
    assert [c.function for c in streamed] == [c.function for c in calls] and lines[-1].done
    # The call and its result go back as Ollama's clients send them (arguments as an object, tool_name).
    follow = ask + [{"role": "assistant", "content": "", "tool_calls": [{"function": {
        "name": "get_weather", "arguments": calls[0].function.arguments}}]},
        {"role": "tool", "tool_name": "get_weather", "content": "Sunny, 21 C"}]
    assert client.chat(model=NAME, messages=follow, options=GREEDY).done


def test_embed(client):
    got = client.embed(model=NAME, input=["hello", "world"])
    assert len(got.embeddings) == 2 and len(got.embeddings[0]) == 576
    assert abs(sum(x * x for x in got.embeddings[0]) - 1) < 1e-3


def test_refusals_are_ollamas_error_shape_naming_the_field(client, server, api_key):
    with pytest.raises(ollama.ResponseError) as err:
        client.chat(model=NAME, messages=[{"role": "user", "content": "hi"}], options={"temperature": 9})
    assert err.value.status_code == 400 and "'options.temperature'" in err.value.error
    with pytest.raises(ollama.ResponseError) as err:
        client.chat(model="no-such-model", messages=[{"role": "user", "content": "hi"}])
    assert err.value.status_code == 404
    with pytest.raises(ollama.ResponseError) as err:
        ollama.Client(host=server).list()  # no key
    assert err.value.status_code == 401
    with urllib.request.urlopen(f"{server}/api/version", timeout=10) as r:  # open, as Ollama's: tools probe it
        assert json.loads(r.read())["version"]


def test_pull_brings_a_gguf_into_the_store_with_ollamas_progress_lines(tmp_path):
    """/api/pull (#34): the official client's pull, streamed and not, from a loopback file server into a server's own
    store; the model is then listed. Refusals in Ollama's shape: no registry name, a model already there, a source
    that is not there, a key kept to some models."""
    from tests.file_server import serve_files
    from tests.servers import Proc, everycycle, free_port, ready, wait_for
    from tests.tiny_gguf import write_tiny_llama

    import subprocess

    keys = tmp_path / "api_keys.json"
    key = subprocess.run(everycycle("keys", "create", "--keys", str(keys), "--may-pull", "yes", "owner"),
                         capture_output=True, text=True, check=True).stdout.strip()
    limited = subprocess.run(everycycle("keys", "create", "--keys", str(keys), "--models", MODEL_ID, "team"),
                             capture_output=True, text=True, check=True).stdout.strip()
    # an unrestricted key, not granted the owner's right to change the box's models (#56)
    ordinary = subprocess.run(everycycle("keys", "create", "--keys", str(keys), "laptop"),
                              capture_output=True, text=True, check=True).stdout.strip()
    # the owner's pattern alias: a model pulled under a name it covers would take every key's requests for it
    # the file server is on loopback, which a pull through the API reaches only where the owner names it (#56)
    (tmp_path / "serving.toml").write_text(f'pull_hosts = ["127.0.0.1"]\n[aliases]\n"claude-*" = "{MODEL_ID}"\n')
    files = tmp_path / "files"
    files.mkdir()
    model = write_tiny_llama(files / "tiny.gguf", n_ctx=256)
    (files / "other.gguf").write_bytes(model.read_bytes())
    (files / "claude-sonnet-4-5.gguf").write_bytes(model.read_bytes())
    (files / "tinyllama-Q8_0.gguf").write_bytes(model.read_bytes())
    source = serve_files(files)
    # the owner's own catalog entry (#59), its repository on the loopback Hub (HF_ENDPOINT)
    (tmp_path / "catalog.toml").write_text(
        '[[model]]\nname = "tinyllama"\ntag = "1b"\nrepo = "someone/tiny-models"\nquants = ["Q8_0"]\n'
        'size_gb = 0.01\ncontext = 256\ncan = ["tools"]\nlicense = "Apache-2.0"\nwhy = "the tests\' own small model"\n')
    port = free_port()
    proc = Proc(everycycle("serve", "--port", str(port), "--keys", str(keys), "--threads", "2", "--ctx-size", "512",
                           "--parallel", "1", "--model-store", str(tmp_path / "store"), "--run-dir",
                           str(tmp_path / "run"), "--settings", str(tmp_path / "serving.toml")), tmp_path / "serve.log",
                env={**os.environ, "EVERYCYCLE_CATALOG": str(tmp_path / "catalog.toml"), "HF_ENDPOINT": source.base,
                     "HF_HUB_OFFLINE": "0", "HF_HUB_DISABLE_TELEMETRY": "1"})
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: ready(base), 120, "the server to become ready", proc)
        client = ollama.Client(host=base, headers={"Authorization": f"Bearer {key}"}, timeout=120)
        lines = list(client.pull(f"{source.base}/tiny.gguf", stream=True))
        statuses = [line.status for line in lines]
        assert statuses[0] == "pulling manifest" and statuses[-1] == "success"
        downloads = [line for line in lines if line.status == "downloading tiny"]
        assert downloads and downloads[-1].completed == downloads[-1].total == model.stat().st_size
        assert "tiny:latest" in [m.model for m in client.list().models]
        assert client.pull(f"{source.base}/other.gguf").status == "success"  # whole, not streamed
        for asked, status, words in ((f"{source.base}/tiny.gguf", 400, "already in the store"),
                                     ("no-such-model", 400, "not in this box's catalog"),
                                     (f"{source.base}/missing.gguf", 400, "HTTP 404"),
                                     ("http://127.0.0.2:9290/telemetry", 400, "not among the hosts")):
            with pytest.raises(ollama.ResponseError) as err:
                client.pull(asked)
            assert err.value.status_code == status and words in err.value.error, err.value.error
        # a catalog name, as Ollama's clients pull: resolved to its repository's Q8_0, stored as tinyllama-1b, and
        # listed and answered under the name the client used
        assert client.pull("tinyllama:1b").status == "success"
        assert "tinyllama:1b" in [m.model for m in client.list().models]
        answered = client.chat(model="tinyllama:1b", messages=[{"role": "user", "content": "hi"}],
                               options={"num_predict": 2})
        assert answered.done and answered.message.content is not None
        with pytest.raises(ollama.ResponseError) as err:
            ollama.Client(host=base, headers={"Authorization": f"Bearer {limited}"}, timeout=60).pull(
                f"{source.base}/other.gguf")
        assert err.value.status_code == 403 and "may not pull" in err.value.error
        with pytest.raises(ollama.ResponseError) as err:
            ollama.Client(host=base, headers={"Authorization": f"Bearer {ordinary}"}, timeout=60).pull(
                f"{source.base}/other.gguf")
        assert err.value.status_code == 403 and "may not change the box's models" in err.value.error
        with pytest.raises(ollama.ResponseError) as err:
            client.pull(f"{source.base}/claude-sonnet-4-5.gguf")
        assert err.value.status_code == 409 and "'claude-*'" in err.value.error
        assert "claude-sonnet-4-5:latest" not in [m.model for m in client.list().models]

        # Ollama's idioms (#59): an empty prompt or chat loads a model, keep_alive 0 unloads it now (both were 400s)
        loaded = client.generate(model="tiny", keep_alive="10m")
        assert loaded.done and loaded.done_reason == "load" and loaded.response == ""
        running = {m.model: m for m in client.ps().models}
        # expires_at: when its keep-alive unloads it (it was the time of asking); the server's own model stays
        left = (running["tiny:latest"].expires_at - datetime.datetime.now(datetime.timezone.utc)).total_seconds()
        assert 500 < left <= 600, left
        assert running[NAME].expires_at.year > datetime.datetime.now().year + 50
        unloaded = client.chat(model="tiny:latest", messages=[], keep_alive=0)
        assert unloaded.done and unloaded.done_reason == "unload" and unloaded.message.content == ""
        assert "tiny:latest" not in [m.model for m in client.ps().models]
        assert client.chat(model="tiny", messages=[]).done_reason == "load"
        with pytest.raises(ollama.ResponseError) as err:
            client.generate(model=MODEL_ID, keep_alive=0)  # the server's own model stays
        assert err.value.status_code == 409 and "stays loaded" in err.value.error
        # /api/copy: a second name for a store model (the same file), the owner's right too
        with pytest.raises(ollama.ResponseError) as err:
            ollama.Client(host=base, headers={"Authorization": f"Bearer {ordinary}"}, timeout=60).copy("other", "x")
        assert err.value.status_code == 403
        assert client.copy("other", "other-copy:latest").status == "success"
        store = tmp_path / "store"
        assert (store / "other-copy" / "other.gguf").stat().st_ino == (store / "other" / "other.gguf").stat().st_ino
        assert client.generate(model="other-copy", prompt="hi", options={"num_predict": 2}).done
        for copied, second, status in (("other", "other-copy", 400), ("nothing-here", "y", 404),
                                       ("other", "claude-sonnet-4-5", 409)):
            with pytest.raises(ollama.ResponseError) as err:
                client.copy(copied, second)
            assert err.value.status_code == status, (copied, second, err.value.error)
        # /api/delete: the owner's right, as a pull; a loaded model is unloaded first
        with pytest.raises(ollama.ResponseError) as err:
            ollama.Client(host=base, headers={"Authorization": f"Bearer {ordinary}"}, timeout=60).delete("tiny")
        assert err.value.status_code == 403
        assert client.delete("tiny").status == "success"
        assert "tiny:latest" not in [m.model for m in client.list().models + client.ps().models]
        with pytest.raises(ollama.ResponseError) as err:
            client.delete("tiny")
        assert err.value.status_code == 404
    finally:
        proc.stop()
        source.shutdown()
