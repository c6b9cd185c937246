from __future__ import annotations

import os
import subprocess
import uuid

import openai
import pytest

from tests.servers import Proc, everycycle, free_port, ready, wait_for

MODEL_ID = "SmolLM2-135M-Instruct.Q4_1"


def _nvml_works() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        return True
    except Exception:
        return False


# Fixtures that start real processes (servers, supervisord, nginx, ipmi_sim, namespaces) or load the model:
# a test using one is marked `system`, so `pytest -m "not system"` runs the pure tests in seconds.
SYSTEM_FIXTURES = {"api_key", "server", "client", "netns", "front", "box", "sim", "model", "tiny", "small_steps",
                   "miss_answer", "split_server", "fleet"}


def pytest_collection_modifyitems(config, items):
    """Tests marked `gpu` run where NVML works (a lent GPU machine), those marked `vulkan` where llama.cpp has a
    Vulkan device (lavapipe in CI); elsewhere they are reported skipped with the reason. Tests that use a
    process-starting fixture are marked `system`."""
    for item in items:
        if SYSTEM_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.system)
    if any("gpu" in item.keywords for item in items) and not _nvml_works():
        skip = pytest.mark.skip(reason="needs an NVIDIA GPU with NVML (marked gpu)")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)
    if os.geteuid() != 0:
        skip = pytest.mark.skip(reason="needs root, as on the box and in CI (marked root)")
        for item in items:
            if "root" in item.keywords:
                item.add_marker(skip)
    if any("cgroup" in item.keywords for item in items):
        from image.cpu_quota import unavailable

        why = unavailable()
        if why:
            skip = pytest.mark.skip(reason=f"needs root and a cgroup cpu controller (marked cgroup): {why}")
            for item in items:
                if "cgroup" in item.keywords:
                    item.add_marker(skip)
    if any("vulkan" in item.keywords for item in items):
        from tests.test_placement_llama import _lavapipe_works

        if not _lavapipe_works():
            skip = pytest.mark.skip(reason="needs llama.cpp built with Vulkan and a Vulkan device (marked vulkan)")
            for item in items:
                if "vulkan" in item.keywords:
                    item.add_marker(skip)


@pytest.fixture(autouse=True)
def bundle_staging_dir(tmp_path, monkeypatch):
    """A bundle's model copies and unpacked archives go to a disk directory (/var/tmp on a box); in a test, its
    own temporary directory, so one a test leaves open is not left behind."""
    monkeypatch.setenv("EVERYCYCLE_STAGING_DIR", str(tmp_path))


@pytest.fixture(scope="session")
def api_key(tmp_path_factory) -> tuple[str, str]:
    keys = tmp_path_factory.mktemp("keys") / "api_keys.json"
    out = subprocess.run(everycycle("keys", "create", "--keys", str(keys), "tests"), capture_output=True, text=True,
                         check=True)
    return str(keys), out.stdout.strip()


class ServerURL(str):
    """The base URL, carrying the process it belongs to."""
    proc: Proc


@pytest.fixture(scope="session")
def server(tmp_path_factory, api_key):
    """One real server for the session: gunicorn (2 workers) plus the engine, default model."""
    keys_file, _ = api_key
    port = free_port()
    logdir = tmp_path_factory.mktemp("serve")
    proc = Proc(everycycle("serve", "--port", str(port), "--keys", keys_file, "--metrics-access", "open", "--threads", "2",
                           "--ctx-size", "2048", "--parallel", "4", "--run-dir", str(logdir)), logdir / "serve.log")
    base = ServerURL(f"http://127.0.0.1:{port}")
    base.proc = proc
    try:
        wait_for(lambda: ready(base), 120, "the server to become ready", proc)
        yield base
    finally:
        proc.stop()


@pytest.fixture(scope="session")
def client(server, api_key) -> openai.OpenAI:
    return openai.OpenAI(base_url=server + "/v1", api_key=api_key[1], max_retries=0, timeout=120)


@pytest.fixture
def netns():
    """A network namespace of the test's own, removed afterwards."""
    name = f"ectest-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)
