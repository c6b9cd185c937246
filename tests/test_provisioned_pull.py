"""A bundle that names its model by source: the server answers with the built-in model while it pulls the named
one from a test-made LAN server (slowly), shows the pull in /v1/models and /metrics (and so on the console), loads
the model once it is in the store, and serves it from the start on the next boot without fetching it again."""

from __future__ import annotations

import hashlib
import json

import openai
import pytest

from host_runtime.common import settings_file
from host_runtime.box_status.rows import models_from_metrics
from host_runtime.console.status_text import model_lines
from host_runtime.serving.settings import ServingSettings
from tests.conftest import MODEL_ID
from tests.file_server import serve_files
from tests.servers import Proc, everycycle, free_port, http_get, ready, wait_for
from tests.tiny_gguf import write_tiny_llama

pytestmark = pytest.mark.system


def models(base: str) -> dict[str, dict]:
    return {m["id"]: m for m in json.loads(http_get(base + "/v1/models")[1])["data"]}


def start(d, settings_path, store):
    port = free_port()
    proc = Proc(everycycle("serve", "--port", str(port), "--threads", "2", "--ctx-size", "256", "--parallel", "1",
                           "--kv-budget-mib", "64", "--settings", str(settings_path), "--model-store", str(store),
                           "--run-dir", str(d / "run")), d / f"serve-{port}.log")
    base = f"http://127.0.0.1:{port}"
    wait_for(lambda: ready(base), 120, "the server", proc)
    return proc, base, openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_the_bundle_model_is_pulled_while_the_built_in_one_answers_then_served(tmp_path):
    files = tmp_path / "files"
    files.mkdir()
    model = write_tiny_llama(files / "tiny.gguf", n_ctx=256, n_embd=256, n_layer=4, n_ff=512)  # about 11 MiB
    sha = hashlib.sha256(model.read_bytes()).hexdigest()
    server = serve_files(files, delay_s=0.2)  # 256 KiB each 0.2 s: about 9 s in all
    settings_path = tmp_path / "serving.toml"
    settings_file.save(ServingSettings(pull_url=f"{server.base}/tiny.gguf", pull_sha256=sha, pull_name="bundled"),
                       settings_path)
    store = tmp_path / "store"
    proc = None
    try:
        proc, base, client = start(tmp_path, settings_path, store)
        # The built-in model answers at once; the bundle's is listed as downloading, and asking for it is a 503
        # that says so.
        assert client.completions.create(model=MODEL_ID, prompt="Hi", max_tokens=2).model == MODEL_ID
        listed = models(base)
        assert listed["bundled"]["state"] == "downloading", listed
        with pytest.raises(openai.APIStatusError) as err:
            client.completions.create(model="bundled", prompt="Hi", max_tokens=2)
        assert err.value.status_code == 503 and "still being pulled" in err.value.message
        text = http_get(base + "/metrics")[1].decode()
        assert 'everycycle_model_pull_state{model="bundled",state="pulling"} 1.0' in text
        seen: dict = {}
        _, pull = models_from_metrics(text, 0.0, seen)
        assert pull.name == "bundled" and pull.state == "pulling" and pull.total_bytes == model.stat().st_size

        # Pulled: loaded at once (without a request), then answering by name.
        wait_for(lambda: models(base).get("bundled", {}).get("state") == "loaded", 120, "the pulled model", proc)
        assert client.completions.create(model="bundled", prompt="Hi", max_tokens=2).model == "bundled"
        text = http_get(base + "/metrics")[1].decode()
        assert 'everycycle_model_pull_state{model="bundled",state="pulled"} 1.0' in text
        assert 'everycycle_model_loads_total{model="bundled"} 1.0' in text
        rows, pull = models_from_metrics(text, 1.0, seen)
        lines = model_lines(type("S", (), {"models": rows, "pull": pull})())
        assert any(line.startswith("bundled: ") and "MiB resident" in line for line in lines), lines
        assert not any(line.startswith("pulling") for line in lines), lines
        assert json.loads((store / ".provisioned.json").read_text())["state"] == "pulled"
        proc.stop()

        # The next boot serves it from the start and fetches nothing.
        requests = len(server.ranges)
        proc, base, client = start(tmp_path, settings_path, store)
        assert client.completions.create(model="bundled", prompt="Hi", max_tokens=2).model == "bundled"
        assert MODEL_ID not in models(base) and len(server.ranges) == requests
    finally:
        if proc is not None:
            proc.stop()
        server.shutdown()
