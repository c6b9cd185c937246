"""The shipped supervisord configuration runs the serving program for real."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from host_runtime.auth.keystore import create_key
from tests.servers import REPO, Proc, free_port, ready, wait_for

BIN = Path(sys.executable).parent


def test_supervisord_runs_serving_and_restarts_it(tmp_path):
    state, run, log = tmp_path / "state", tmp_path / "run", tmp_path / "log"
    for d in (state, run, log):
        d.mkdir()
    key = create_key(state / "api_keys.json", "dev")
    port = free_port()
    env = {**os.environ, "EVERYCYCLE_BIN": str(BIN), "EVERYCYCLE_HOST": "127.0.0.1", "EVERYCYCLE_PORT": str(port),
           "EVERYCYCLE_STATE_DIR": str(state), "EVERYCYCLE_RUN_DIR": str(run), "EVERYCYCLE_LOG_DIR": str(log),
           "EVERYCYCLE_SERVE_ARGS": "--threads 2 --ctx-size 1024 --parallel 2",
           "EVERYCYCLE_GOVERNOR_ARGS": "--backend simulator --sim-speed 20",
           "EVERYCYCLE_BMC_ARGS": f"--backend local --listen 127.0.0.1:{free_port()}"}
    conf = str(REPO / "supervisor.d" / "supervisord.conf")
    sup = Proc([str(BIN / "supervisord"), "-c", conf], tmp_path / "supervisord.out", env=env)
    ctl = [str(BIN / "supervisorctl"), "-s", f"unix://{run}/supervisor.sock"]
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: ready(base), 90, "serving under supervisord", sup)
        for program in ("serving", "discovery", "governor", "bmc"):
            wait_for(lambda: "RUNNING" in subprocess.run(ctl + ["status", program], capture_output=True,
                                                           text=True).stdout, 30, f"{program} RUNNING")
        wait_for(lambda: (run / "topology.json").exists(), 30, "discovery to write the topology")
        wait_for(lambda: (run / "governor.json").exists(), 30, "the governor to publish its state")
        from host_runtime.discovery import topology

        topology.validate(json.loads((run / "topology.json").read_text()))
        # Kill the engine: the serving program must go down and come back by itself.
        engine_pid = int(subprocess.run(["pgrep", "-f", f"engine --socket {run}/serving/engine.sock"],
                                        capture_output=True, text=True).stdout.split()[0])
        os.kill(engine_pid, 9)
        wait_for(lambda: not ready(base), 30, "the server to notice the dead engine")
        wait_for(lambda: ready(base), 90, "supervisord to restart serving", sup)
        assert (log / "serving.log").stat().st_size > 0
        import openai

        client = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0)
        assert client.chat.completions.create(model="SmolLM2-135M-Instruct.Q4_1", max_tokens=3,
                                              messages=[{"role": "user", "content": "Hi"}]).choices[0].message.content
    finally:
        subprocess.run(ctl + ["shutdown"], capture_output=True, timeout=30)
        sup.popen.wait(timeout=30)
        sup.stop()
