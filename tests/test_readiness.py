"""/health is liveness; /ready is a real canary generation: 503 until it passes, and when the engine is wedged."""

from __future__ import annotations

import json
import os
import signal

import pytest

from tests.servers import Proc, everycycle, free_port, http_get, wait_for

pytestmark = pytest.mark.system  # every test here starts processes or loads the model


@pytest.fixture
def split_server(tmp_path):
    """The HTTP front end started first, pointed at an engine socket nobody serves yet."""
    sock = str(tmp_path / "engine.sock")
    port = free_port()
    front = Proc(everycycle("serve", "--port", str(port), "--engine-socket", sock, "--ready-timeout", "2",
                            "--workers", "1"), tmp_path / "front.log")
    base = f"http://127.0.0.1:{port}"
    procs = [front]
    try:
        wait_for(lambda: _status(base + "/health") == 200, 30, "the front end", front)
        yield base, sock, tmp_path, procs
    finally:
        for p in procs:
            p.stop()


def _status(url: str) -> int | None:
    try:
        return http_get(url, timeout=10)[0]
    except OSError:
        return None


def test_ready_follows_the_engine(split_server):
    base, sock, tmp, procs = split_server
    status, body = http_get(base + "/ready")
    assert status == 503 and json.loads(body)["status"] == "not_ready"
    health = json.loads(http_get(base + "/health")[1])
    assert {k: health[k] for k in ("status", "engine")} == {"status": "ok", "engine": "unreachable"}
    # Off the box image, the system's version and slot say why they cannot be read.
    assert health["system"]["version"].startswith("unavailable: no IMAGE_VERSION")
    assert health["system"]["slot"].startswith("unavailable") and health["system"]["last_update"] is None

    engine = Proc(everycycle("engine", "--socket", sock, "--threads", "2", "--ctx-size", "512", "--parallel", "1"),
                  tmp / "engine.log")
    procs.append(engine)
    wait_for(lambda: _status(base + "/ready") == 200, 60, "the canary to pass", engine)
    assert "canary" in json.loads(http_get(base + "/ready")[1])["reason"]

    # Wedged: the engine stops answering. Liveness still answers; readiness turns 503 once the cache expires.
    os.kill(engine.popen.pid, signal.SIGSTOP)
    try:
        wait_for(lambda: _status(base + "/ready") == 503, 30, "/ready to report the wedged engine")
        assert _status(base + "/health") == 200
    finally:
        os.kill(engine.popen.pid, signal.SIGCONT)
    wait_for(lambda: _status(base + "/ready") == 200, 30, "/ready to recover")


def test_serve_refuses_a_model_that_is_not_gguf(tmp_path):
    bogus = tmp_path / "model.gguf"
    bogus.write_bytes(b"not a model at all")
    import subprocess

    out = subprocess.run(everycycle("serve", "--model", str(bogus), "--port", "0"), capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2
    assert "--model" in out.stderr and "not a GGUF" in out.stderr
    assert "Traceback" not in out.stderr
