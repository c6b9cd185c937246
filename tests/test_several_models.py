"""Several models on one box: the default model and two tiny GGUFs from the store, loaded when a request names
them, unloaded least recently used first within a memory budget that holds one of them; a pinned one stays."""

from __future__ import annotations

import json
import os
import subprocess
import urllib.error
import urllib.request

import openai
import pytest

from host_runtime.models.store import Store
from tests.conftest import MODEL_ID
from tests.servers import Proc, everycycle, free_port, http_get, metric_value, ready, wait_for
from tests.tiny_gguf import write_tiny_llama

pytestmark = pytest.mark.system


@pytest.fixture(scope="module")
def box(tmp_path_factory):
    d = tmp_path_factory.mktemp("several")
    store = Store(d / "store")
    for name, seed in (("tiny-a", 1), ("tiny-b", 2)):
        # 11 MiB each: a model's share of the budget is well above the rounding of the budget to a MiB.
        f = write_tiny_llama(d / f"{name}.gguf", n_ctx=256, seed=seed, n_embd=256, n_layer=4, n_ff=512)
        store.root.mkdir(parents=True, exist_ok=True)
        store.admit(f, name, "0" * 64, str(f), move=True)
    # A budget that holds the default model and one tiny one, by the planner's count, with half a tiny one spare.
    from host_runtime.engine.model import ContextConfig, default_model_path
    from host_runtime.placement.session import resident_bytes_for

    def need(path):  # what the pool counts: the planner's bytes and the engine's prefix cache's RAM tier (16 MiB)
        return resident_bytes_for(str(path), ContextConfig(n_ctx_per_seq=256, n_parallel=1,
                                                         kv_budget_bytes=64 << 20)) + (16 << 20)

    budget_mib = (need(default_model_path()) + 1.5 * need(store.path_of(store.get("tiny-a")))) / 2**20
    port = free_port()
    proc = Proc(everycycle("serve", "--port", str(port), "--threads", "2", "--workers", "2", "--ctx-size", "256",
                           "--parallel", "1", "--kv-budget-mib", "64", "--prefix-cache-ram-mib", "16",
                           "--model-store", str(store.root),
                           "--models-memory-mib", str(int(budget_mib)), "--run-dir", str(d / "run" / "serving")), d / "serve.log")
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: ready(base), 120, "the server", proc)
        proc.run_dir = d / "run"  # EVERYCYCLE_RUN_DIR for `everycycle models`, which asks the pool what is loaded
        yield base, store, openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=120), proc
    finally:
        proc.stop()


def states(base: str) -> dict[str, str]:
    return {m["id"]: m["state"] for m in json.loads(http_get(base + "/v1/models")[1])["data"]}


def ask(client, model: str) -> str:
    return client.completions.create(model=model, prompt="Hello", max_tokens=3, temperature=0).model


def test_every_model_is_listed_and_a_request_loads_the_one_it_names(box):
    base, _, client, _ = box
    assert states(base) == {MODEL_ID: "loaded", "tiny-a": "available", "tiny-b": "available"}
    assert ask(client, "tiny-a") == "tiny-a"
    assert states(base)["tiny-a"] == "loaded"
    assert ask(client, MODEL_ID) == MODEL_ID  # the default keeps answering beside it
    one = json.loads(http_get(base + "/v1/models/tiny-b")[1])
    assert one["state"] in ("available", "loaded") and one["context_length"] == 256


def test_a_budget_that_holds_one_unloads_the_least_recently_used(box):
    base, _, client, proc = box
    for model, other in (("tiny-a", "tiny-b"), ("tiny-b", "tiny-a"), ("tiny-a", "tiny-b")):
        assert ask(client, model) == model
        s = states(base)
        assert s[model] == "loaded" and s[other] == "available" and s[MODEL_ID] == "loaded", s
    assert "unloading tiny-b (to make room for tiny-a)" in proc.log()
    text = http_get(base + "/metrics")[1].decode()
    assert metric_value(text, "everycycle_tokens_predicted_total") > 0 and 'model="tiny-a"' in text
    # The room a model is given counts its engine's prefix cache RAM tier (16 MiB here), which it kept outside the
    # budget before (the third hardening review).
    _, store, _, _ = box
    from prometheus_client.parser import text_string_to_metric_families

    from host_runtime.engine.model import ContextConfig
    from host_runtime.placement.session import resident_bytes_for

    planned = next(s.value for f in text_string_to_metric_families(text) for s in f.samples
                   if s.name == "everycycle_model_memory_bytes" and s.labels == {"model": "tiny-a", "kind": "planned"})
    assert planned == resident_bytes_for(str(store.path_of(store.get("tiny-a"))), ContextConfig(
        n_ctx_per_seq=256, n_parallel=1, kv_budget_bytes=64 << 20)) + (16 << 20)


def test_a_pinned_model_stays_and_what_cannot_fit_beside_it_is_refused(box):
    base, store, client, _ = box
    store.set_pinned("tiny-a", True)
    try:
        assert ask(client, "tiny-a") == "tiny-a"
        with pytest.raises(openai.APIStatusError) as err:
            ask(client, "tiny-b")
        assert err.value.status_code == 507 and "pinned models hold" in err.value.message
        assert states(base)["tiny-a"] == "loaded"
        # the capability map says so to a fleet's gateway, which then loads tiny-b on another box (#62)
        assert rooms(base)["tiny-b"] == ("never", store.path_of(store.get("tiny-b")).stat().st_size)
    finally:
        store.set_pinned("tiny-a", False)
    assert rooms(base)["tiny-b"][0] == "unloads"  # tiny-a, idle and no longer pinned, would make way


def rooms(base: str) -> dict[str, tuple]:
    """Each model not loaded: what loading it would take now, and its file's size (the capability map)."""
    from host_runtime.fleet.capabilities import Capabilities

    caps = Capabilities.from_wire(json.loads(http_get(base + "/v1/everycycle/capabilities", timeout=30)[1]))
    return {m.id: (m.room, m.size_bytes) for m in caps.models if m.state == "available"}


def test_an_unknown_model_and_a_bad_keep_alive_are_clear_errors(box):
    base, _, client, _ = box
    with pytest.raises(openai.NotFoundError) as err:
        ask(client, "no-such-model")
    assert "tiny-a" in err.value.message
    req = urllib.request.Request(base + "/v1/completions", data=json.dumps(
        {"model": "tiny-b", "prompt": "x", "max_tokens": 1, "keep_alive": "soon"}).encode(),
        headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as http_err:
        urllib.request.urlopen(req, timeout=30)
    assert http_err.value.code == 400 and json.loads(http_err.value.read())["error"]["param"] == "keep_alive"


def test_removing_a_loaded_model_needs_force_which_unloads_it_first(box, tmp_path):
    base, store, client, proc = box
    f = write_tiny_llama(tmp_path / "tiny-c.gguf", n_ctx=256, seed=3)
    store.admit(f, "tiny-c", "0" * 64, str(f), move=True)
    assert ask(client, "tiny-c") == "tiny-c"

    def rm(*args):
        return subprocess.run(everycycle("models", "--store", str(store.root), "rm", *args), capture_output=True,
                              text=True, timeout=120, env={**os.environ, "EVERYCYCLE_RUN_DIR": str(proc.run_dir)})

    out = rm("tiny-c")
    assert out.returncode == 1 and "is loaded and being served: --force unloads it first" in out.stderr
    assert states(base)["tiny-c"] == "loaded"
    out = rm("tiny-c", "--force")
    assert out.returncode == 0 and "unloaded tiny-c" in out.stderr, out.stderr
    assert "tiny-c" not in states(base)
    text = http_get(base + "/metrics")[1].decode()
    assert 'everycycle_model_unloads_total{model="tiny-c",reason="removed"} 1.0' in text
    assert 'everycycle_model_loads_total{model="tiny-c"} 1.0' in text
    out = rm(MODEL_ID, "--force")  # the model the server started with is not in the store: nothing to remove
    assert out.returncode == 1 and "no model named" in out.stderr


def test_an_embedding_model_answers_embeddings_with_its_own_pooling_and_refuses_chat(box, tmp_path):
    """Two GGUFs with the same weights: one declares CLS pooling (an embedding model), the other declares nothing
    (a generating model, whose embeddings are the tokens' mean). The same input gives different vectors."""
    import gguf

    base, store, client, _ = box
    for name, pooling in (("tiny-embed", gguf.PoolingType.CLS), ("tiny-same", None)):
        f = write_tiny_llama(tmp_path / f"{name}.gguf", n_ctx=256, seed=7, pooling_type=pooling)
        store.admit(f, name, "0" * 64, str(f), move=True)
    assert store.get("tiny-embed").pooling == "cls" and store.get("tiny-same").pooling == ""
    text = ["one two three four five six"]
    cls = client.embeddings.create(model="tiny-embed", input=text)
    mean = client.embeddings.create(model="tiny-same", input=text)
    assert cls.model == "tiny-embed" and len(cls.data[0].embedding) == 32
    assert max(abs(a - b) for a, b in zip(cls.data[0].embedding, mean.data[0].embedding)) > 1e-3
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="tiny-embed", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert err.value.code == "model_not_generative" and "embedding model" in err.value.message


def _post(url: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_a_reranker_scores_documents_for_a_query_best_first(box, tmp_path):
    """/v1/rerank (#34): a GGUF declaring rank pooling scores each (query, document) pair as llama-server lays it
    out; the answer is Jina's and Cohere's shape, best first, top_n of them. A pair's score does not depend on the
    others sent with it; a generating model is no reranker (400), and a reranker answers no embeddings."""
    import gguf

    base, store, client, _ = box
    f = write_tiny_llama(tmp_path / "tiny-rank.gguf", n_ctx=256, seed=7, pooling_type=gguf.PoolingType.RANK)
    store.admit(f, "tiny-rank", "0" * 64, str(f), move=True)
    assert store.get("tiny-rank").pooling == "rank"
    docs = ["the cat sat on the mat", "a dog ran far away", {"text": "stocks fell on monday"}, "rain in spain"]
    status, doc = _post(base + "/v1/rerank", {"model": "tiny-rank", "query": "where is the cat", "documents": docs,
                                              "top_n": 3, "return_documents": True})
    assert status == 200 and doc["model"] == "tiny-rank" and doc["usage"]["prompt_tokens"] > 4 * 4, doc
    results = doc["results"]
    scores = [r["relevance_score"] for r in results]
    assert len(results) == 3 and scores == sorted(scores, reverse=True) and len(set(scores)) > 1
    texts = [d["text"] if isinstance(d, dict) else d for d in docs]
    assert all(r["document"]["text"] == texts[r["index"]] for r in results)
    best = results[0]
    status, alone = _post(base + "/rerank", {"model": "tiny-rank", "query": "where is the cat",
                                             "documents": [texts[best["index"]]]})
    assert status == 200 and "document" not in alone["results"][0]
    assert abs(alone["results"][0]["relevance_score"] - best["relevance_score"]) < 1e-4
    status, refused = _post(base + "/v1/rerank", {"model": MODEL_ID, "query": "q", "documents": ["d"]})
    assert status == 400 and refused["error"]["code"] == "model_not_reranker", refused
    with pytest.raises(openai.BadRequestError) as err:
        client.embeddings.create(model="tiny-rank", input=["x"])
    assert err.value.code == "model_not_embedding"
    for body, param in (({"model": "tiny-rank", "documents": ["d"]}, "query"),
                        ({"model": "tiny-rank", "query": "q", "documents": []}, "documents"),
                        ({"model": "tiny-rank", "query": "q", "documents": ["d", 3]}, "documents[1]"),
                        ({"model": "tiny-rank", "query": "q", "documents": ["d"], "top_n": 0}, "top_n")):
        status, refused = _post(base + "/v1/rerank", body)
        assert status == 400 and refused["error"]["param"] == param, refused


def test_the_capability_map_says_what_each_model_can_take_now(box):
    from host_runtime.engine.model import default_model_path
    from host_runtime.fleet.capabilities import Capabilities

    base, _, client, _ = box
    for _ in range(3):
        client.completions.create(model=MODEL_ID, prompt="Hello there", max_tokens=8, temperature=0)
    caps = Capabilities.from_wire(json.loads(http_get(base + "/v1/everycycle/capabilities", timeout=30)[1]))
    by_id = {m.id: m for m in caps.models}
    default = by_id[MODEL_ID]
    assert default.state == "loaded" and default.slots_total == 1 and default.slots_free == 1
    assert default.queue_depth == 0 and default.tokens_per_s > 0 and 0 < default.ttft_p50_s < 30
    assert sum(default.placement.values()) > 0 and set(default.prefix_cache_bytes) >= {"ram", "disk"}
    assert default.size_bytes == default_model_path().stat().st_size and 0 < default.load_s < 120
    assert by_id["tiny-b"].state in ("available", "loaded")
    assert caps.governor.state == "unavailable" and "--governor-state" in caps.governor.reason
    assert not caps.draining and caps.accepts_new_work() == (True, "") and caps.routable(MODEL_ID)
