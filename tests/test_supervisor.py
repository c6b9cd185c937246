"""The shipped supervisord configuration runs the serving program for real."""

from __future__ import annotations

import getpass
import json
import os
import ssl
import subprocess
import sys
from pathlib import Path

import pytest

from host_runtime.auth.keystore import create_key
from host_runtime.common.http_client import unix_get
from host_runtime.front import settings as front_settings
from host_runtime.front.settings import FrontSettings
from tests.servers import REPO, Proc, free_port, http_status, raw_get, ready, wait_for

pytestmark = pytest.mark.system  # every test here starts processes or loads the model

BIN = Path(sys.executable).parent


def test_supervisord_runs_serving_and_restarts_it(tmp_path):
    state, run, log = tmp_path / "state", tmp_path / "run", tmp_path / "log"
    for d in (state, run, log):
        d.mkdir()
    key = create_key(state / "api_keys.json", "dev")
    port, http_port = free_port(), free_port()
    front_settings.save(FrontSettings(listen="127.0.0.1", https_port=port, http_port=http_port), state / "front.toml")
    env = {**os.environ, "EVERYCYCLE_BIN": str(BIN),
           "EVERYCYCLE_STATE_DIR": str(state), "EVERYCYCLE_RUN_DIR": str(run), "EVERYCYCLE_LOG_DIR": str(log),
           "EVERYCYCLE_CACHE_DIR": str(tmp_path / "cache"), "EVERYCYCLE_SERVICE_USER": getpass.getuser(),
           "EVERYCYCLE_GOVERNOR_USER": getpass.getuser(), "EVERYCYCLE_FRONT_USER": getpass.getuser(),
           "EVERYCYCLE_BMC_USER": getpass.getuser(), "EVERYCYCLE_FLEET_USER": getpass.getuser(),
           "EVERYCYCLE_FLEET_ADDRESS_USER": getpass.getuser(), "EVERYCYCLE_SHARD_USER": getpass.getuser(),
           "EVERYCYCLE_SERVE_ARGS": "--threads 2 --ctx-size 1024 --parallel 2",
           "EVERYCYCLE_GOVERNOR_ARGS": "--backend simulator --sim-speed 20",
           "EVERYCYCLE_BMC_ARGS": f"--backend local --listen 127.0.0.1:{free_port()}"}
    conf = str(REPO / "supervisor.d" / "supervisord.conf")
    sup = Proc([str(BIN / "supervisord"), "-c", conf], tmp_path / "supervisord.out", env=env)
    ctl = [str(BIN / "supervisorctl"), "-s", f"unix://{run}/supervisor.sock"]
    base = f"https://127.0.0.1:{port}"
    cert = state / "tls" / "ca.crt"  # the box's local CA
    https = ssl.create_default_context(cafile=None)

    def ready_https() -> bool:
        if not cert.exists():
            return False
        https.load_verify_locations(cafile=str(cert))
        return ready(base, context=https)

    try:
        wait_for(ready_https, 90, "serving under supervisord, through the front", sup)
        # Plain HTTP only redirects (the key never crosses the LAN in clear); /health answers there for probes.
        status, headers, _ = raw_get(http_port, "/v1/models")
        assert status == 308 and headers["location"] == f"https://127.0.0.1:{port}/v1/models"
        assert raw_get(http_port, "/health")[0] == 200
        # /metrics needs a key by default; the box's own readers use the Unix socket without one.
        assert http_status(base + "/metrics", context=https) == 401
        assert http_status(base + "/metrics", context=https, key=key) == 200
        assert unix_get(str(run / "serving" / "http.sock"), "/metrics", 5).status == 200
        # fleet: no fleet.toml here, so it waits idle (a box that is not the fleet's gateway), RUNNING all the same.
        for program in ("front", "serving", "discovery", "governor", "bmc", "fleet", "fleet-address", "shard-host"):
            wait_for(lambda program=program: "RUNNING" in subprocess.run(ctl + ["status", program], capture_output=True,
                                                           text=True).stdout, 30, f"{program} RUNNING")
        assert "not the fleet's gateway" in (log / "fleet.log").read_text()
        assert "no virtual_address" in (log / "fleet-address.log").read_text()
        assert "this box lends nothing" in (log / "shard-host.log").read_text()
        # The prefix cache's disk tier is on disk, private, and nowhere under RUN_DIR (a RAM file system on the box).
        cache_dir = tmp_path / "cache" / "prefix-cache"
        assert cache_dir.is_dir() and cache_dir.stat().st_mode & 0o777 == 0o700
        assert not list(run.rglob("prefix-cache"))
        wait_for(lambda: (run / "discovery" / "topology.json").exists(), 30, "discovery to write the topology")
        wait_for(lambda: (run / "governor" / "governor.json").exists(), 30, "the governor to publish its state")
        from host_runtime.discovery import topology

        topology.validate(json.loads((run / "discovery" / "topology.json").read_text()))
        # Kill the engine: the serving program must go down and come back by itself.
        engine_pid = int(subprocess.run(["pgrep", "-f", f"engine --socket {run}/serving/engine.sock"],
                                        capture_output=True, text=True).stdout.split()[0])
        os.kill(engine_pid, 9)
        wait_for(lambda: not ready_https(), 30, "the server to notice the dead engine")
        wait_for(ready_https, 90, "supervisord to restart serving", sup)
        assert (log / "serving.log").stat().st_size > 0
        import httpx2
        import openai

        client = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0,
                               http_client=httpx2.Client(verify=https))
        assert client.chat.completions.create(model="SmolLM2-135M-Instruct.Q4_1", max_tokens=3,
                                              messages=[{"role": "user", "content": "Hi"}]).choices[0].message.content
    finally:
        subprocess.run(ctl + ["shutdown"], capture_output=True, timeout=30)
        sup.popen.wait(timeout=30)
        sup.stop()
