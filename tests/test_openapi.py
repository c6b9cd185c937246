"""The API's OpenAPI document matches the real routes, and schemathesis fuzzes a real server from it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import MODEL_ID
from tests.servers import REPO, Proc, everycycle, free_port, http_get, ready, wait_for

DOC = REPO / "host_runtime" / "serving" / "openapi.json"
METHODS = ("get", "post", "put", "delete", "patch")


def _real_routes() -> dict[str, set[str]]:
    """Every route the falcon app has, with the methods its resource answers (falcon's own router)."""
    from host_runtime.serving.app import AppConfig, create_app

    app = create_app(AppConfig(engine_socket="/nonexistent"))
    routes: dict[str, set[str]] = {}
    for root in app._router._roots:
        stack = [root]
        while stack:
            node = stack.pop()
            stack.extend(node.children)
            if node.resource is not None:
                # The resource's own responders; falcon adds OPTIONS and 405 ones by itself.
                routes[node.uri_template] = {m.lower() for m, fn in node.method_map.items()
                                             if getattr(fn, "__self__", None) is node.resource}
    return routes


def test_the_document_lists_exactly_the_real_routes_and_methods():
    doc = json.loads(DOC.read_text())
    documented = {path: {m for m in item if m in METHODS} for path, item in doc["paths"].items()}
    assert documented == _real_routes()


def test_the_document_is_the_one_the_request_models_generate():
    """Request bodies are described by the models that check them (serving/request_models.py), so the two cannot
    disagree; the routes and error shapes come from openapi_routes.json, checked against the app above."""
    from host_runtime.serving.openapi import document_text

    assert DOC.read_text() == document_text(), "openapi.json is stale: .venv/bin/python -m host_runtime.serving.openapi --write"


def test_every_request_body_the_document_names_is_a_model_that_checks_it():
    from host_runtime.serving import request_models

    doc = json.loads(DOC.read_text())
    bodies = {(path, content): op["requestBody"]["content"][content] for path, item in doc["paths"].items()
              for op in item.values() if isinstance(op, dict) and "requestBody" in op
              for content in op["requestBody"]["content"]}
    named = {body["schema"]["$ref"].rsplit("/", 1)[1] for (_, content), body in bodies.items()
             if content == "application/json"}
    assert named == {model.__name__ for model in request_models.DOCUMENTED}
    # The one form (a sound is a file): its fields are checked by serving/transcription.parse, which names them
    forms = {path: body["schema"] for (path, content), body in bodies.items() if content != "application/json"}
    assert list(forms) == ["/v1/audio/transcriptions"] and forms["/v1/audio/transcriptions"]["required"] == [
        "file", "model"]


@pytest.mark.system
def test_the_server_serves_its_document_without_a_key(server):
    status, body = http_get(server + "/openapi.json")
    assert status == 200 and json.loads(body) == json.loads(DOC.read_text())


@pytest.mark.system
def test_schemathesis_finds_no_server_error_and_the_engine_survives(tmp_path, api_key):
    """Bounded: a small context (every generation ends within 128 tokens: max_tokens is a ceiling, so a fuzzed
    max_tokens of millions runs to the context's end) and a fixed number of examples."""
    pytest.importorskip("schemathesis", reason="schemathesis is in the project's test extra")
    keys_file, key = api_key
    port = free_port()
    proc = Proc(everycycle("serve", "--port", str(port), "--keys", keys_file, "--threads", "2", "--ctx-size", "256",
                           "--parallel", "2", "--run-dir", str(tmp_path)), tmp_path / "serve.log")
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: ready(base), 120, "the server to become ready", proc)
        engine_pid = _engine_pid(tmp_path)
        # The served model's id pinned in a copy of the document, so examples get past model_not_found into the
        # sampling, grammar and generation code.
        doc = json.loads(DOC.read_text())
        pinned = {"type": "string", "enum": [MODEL_ID]}
        for schema in doc["components"]["schemas"].values():
            if "model" in schema.get("properties", {}):
                schema["properties"]["model"] = pinned
        # A pull's source pinned to one refused before any download: fuzzed URLs would be real downloads.
        pull = doc["components"]["schemas"]["OllamaPullRequest"]["properties"]
        pull["model"] = pull["name"] = {"type": "string", "enum": ["llama3.2"]}
        (tmp_path / "openapi.json").write_text(json.dumps(doc))
        report = tmp_path / "junit.xml"
        out = subprocess.run(
            [str(Path(sys.executable).parent / "st"), "run", str(tmp_path / "openapi.json"), "--url", base,
             "--header", f"Authorization: Bearer {key}", "--checks", "not_a_server_error",
             # One worker: with two, hypothesis describing a strategy ran ast.parse on two threads at once, and
             # Python 3.11 failed ("AST constructor recursion depth mismatch") in 2 of 4 runs.
             "--max-examples", "50", "--seed", "1", "--request-timeout", "60", "--workers", "1",
             "--report", "junit", "--report-junit-path", str(report), "--no-color"],
            capture_output=True, text=True, timeout=900, cwd=tmp_path, env={**os.environ, "NO_COLOR": "1"})
        summary = out.stdout[-4000:] + out.stderr[-2000:]
        assert out.returncode == 0, summary
        statuses = _statuses(proc.log())
        assert statuses and not {s for s in statuses if s.startswith("5")}, proc.log()[-3000:]
        assert _engine_pid(tmp_path) == engine_pid  # never restarted
        assert ready(base)
    finally:
        proc.stop()


def _engine_pid(run_dir: Path) -> int:
    from host_runtime.engine.client import EngineClient

    return EngineClient(str(run_dir / "engine.sock")).info(timeout=5).pid


def _statuses(access_log: str) -> set[str]:
    """The status codes in gunicorn's access lines ('"POST /v1/x HTTP/1.1" 400 ...')."""
    import re

    return set(re.findall(r'"[A-Z]+ [^"]* HTTP/1\.[01]" (\d{3}) .*schemathesis', access_log))
