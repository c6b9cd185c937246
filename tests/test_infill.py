"""Fill in the middle (editor autocomplete, #34): the prompt laid out around the model's FIM tokens (pure), then a
real server with a tiny random-weight GGUF whose vocabulary has them, through /v1/completions' `suffix` (the openai
client), llama-server's /infill and Ollama's /api/generate `suffix` (the ollama client); a model without FIM tokens
refuses with a 400 naming it."""

from __future__ import annotations

import json
import urllib.request

import openai
import pytest

from host_runtime.engine.errors import RequestRejected
from host_runtime.engine.prompt import PromptBuilder
from tests.conftest import MODEL_ID
from tests.servers import Proc, everycycle, free_port, ready, wait_for
from tests.tiny_gguf import write_tiny_llama


class _Vocab:
    """A stand-in model for the layout alone: each character a token, FIM tokens as given."""

    def __init__(self, fim: dict):
        self._fim = fim
        self.model = type("M", (), {"token_bos": lambda self: 1})()

    def tokenize(self, text, *, add_bos, special):
        assert not special  # the texts are plain: markup in them is never a special token
        return [ord(c) for c in text]

    def add_bos(self):
        return True

    def fim_tokens(self):
        return self._fim


def _builder(fim: dict) -> PromptBuilder:
    builder = PromptBuilder.__new__(PromptBuilder)
    builder._model = _Vocab(fim)
    return builder


def test_the_prompt_is_laid_out_around_the_fim_tokens():
    PRE, SUF, MID, SEP, REP = -1, -2, -3, -4, -5
    plain = _builder({"pre": PRE, "suf": SUF, "mid": MID})
    assert plain.infill_tokens("ab", "c") == [1, PRE, 97, 98, SUF, 99, MID]
    assert plain.infill_tokens("a", "", extra=[{"filename": "x", "text": "y"}], after="z") == \
        [1, PRE, 97, SUF, MID, 122]  # no separator token: other files cannot be marked, so they are left out
    repo = _builder({"pre": PRE, "suf": SUF, "mid": MID, "sep": SEP, "rep": REP})
    tokens = repo.infill_tokens("a", "b", extra=[{"filename": "u.py", "text": "v"}])
    assert tokens[:2] == [1, REP] and tokens.count(SEP) == 2 and tokens[-5:] == [PRE, 97, SUF, 98, MID]
    with pytest.raises(RequestRejected) as err:
        _builder({"rep": REP}).infill_tokens("a", "b")
    assert err.value.status == 400 and err.value.code == "model_not_infill" and "FIM_PRE" in err.value.message


@pytest.fixture(scope="module")
def fim_server(tmp_path_factory):
    d = tmp_path_factory.mktemp("fim")
    model = write_tiny_llama(d / "tiny-fim.gguf", n_ctx=1024, fim=True)
    port = free_port()
    proc = Proc(everycycle("serve", "--port", str(port), "--model", str(model), "--threads", "2", "--workers", "1",
                           "--parallel", "2", "--ctx-size", "512", "--run-dir", str(d)), d / "serve.log")
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: ready(base), 60, "the tiny FIM server", proc)
        yield base
    finally:
        proc.stop()


def _post(url: str, doc: dict, key: str | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, json.dumps(doc).encode(), {"Content-Type": "application/json",
                                                                **({"Authorization": f"Bearer {key}"} if key else {})})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@pytest.mark.system
def test_fill_in_the_middle_through_every_api_that_offers_it(fim_server):
    client = openai.OpenAI(base_url=fim_server + "/v1", api_key="unused", max_retries=0, timeout=120)
    ask = dict(model="tiny-fim", prompt="def add(a, b):\n    return ", suffix="\n\nprint(add(1, 2))\n",
               max_tokens=12, temperature=0)
    whole = client.completions.create(**ask)
    middle = whole.choices[0].text
    assert whole.choices[0].finish_reason in ("length", "stop") and whole.usage.completion_tokens >= 1
    # The prompt is the prefix, the suffix (a token a byte at least, in this byte-level vocabulary) and three FIM
    # tokens: more than the prefix alone by all of them.
    plain = client.completions.create(model="tiny-fim", prompt=ask["prompt"], max_tokens=1, temperature=0)
    assert whole.usage.prompt_tokens >= plain.usage.prompt_tokens + len(ask["suffix"].encode()) + 3
    streamed = "".join(c.choices[0].text for c in client.completions.create(**ask, stream=True) if c.choices)
    assert streamed == middle

    # llama-server's /infill, whole and streamed: the same middle.
    status, body = _post(fim_server + "/infill", {"input_prefix": ask["prompt"], "input_suffix": ask["suffix"],
                                                  "n_predict": 12, "temperature": 0})
    doc = json.loads(body)
    assert status == 200 and doc["content"] == middle and doc["stop"] is True
    assert doc["tokens_predicted"] == whole.usage.completion_tokens and doc["stop_type"] in ("limit", "eos")
    status, body = _post(fim_server + "/infill", {"input_prefix": ask["prompt"], "input_suffix": ask["suffix"],
                                                  "n_predict": 12, "temperature": 0, "stream": True})
    lines = [json.loads(line[6:]) for line in body.decode().split("\n\n") if line.startswith("data: ")]
    assert "".join(line["content"] for line in lines) == middle and lines[-1]["stop"] is True
    status, body = _post(fim_server + "/infill", {"input_prefix": 7})
    assert status == 400 and json.loads(body)["error"]["param"] == "input_prefix"

    # Ollama's /api/generate with a suffix (Continue's autocomplete through its ollama provider).
    import ollama

    said = ollama.Client(host=fim_server).generate(model="tiny-fim", prompt=ask["prompt"], suffix=ask["suffix"],
                                                   options={"temperature": 0, "num_predict": 12})
    assert said.response == middle


@pytest.mark.system
def test_a_model_without_fim_tokens_refuses_infill_naming_why(server, api_key):
    _, key = api_key
    for path, doc in (("/v1/completions", {"model": MODEL_ID, "prompt": "a", "suffix": "b", "max_tokens": 4}),
                      ("/infill", {"input_prefix": "a", "input_suffix": "b", "n_predict": 4})):
        status, body = _post(server + path, doc, key)
        error = json.loads(body)["error"]
        assert status == 400 and error["code"] == "model_not_infill" and error["param"] == "suffix", (path, error)
