"""The device check script runs where CI can run it (lavapipe), so it cannot rot before a GPU session uses it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.servers import REPO

pytestmark = pytest.mark.system  # every test here starts processes or loads the model


@pytest.mark.vulkan
def test_the_device_check_runs_on_lavapipe_and_reports_everything():
    # The default batching mode alone here: the mixed mode doubled this test's time (~4 min on 2 cores); the
    # device run takes both (gpu_check.py's --servers default).
    out = subprocess.run(["bash", "bench/gpu_check.sh", "--backend", "vulkan", "--levels", "1", "--max-tokens", "4",
                          "--governor-seconds", "3", "--servers", "everycycle", "--row-probe-types", "q4_k_m",
                          "--row-probe-rows", "3"], cwd=REPO, capture_output=True,
                         text=True, timeout=900,
                         env={**os.environ, "PYTHON": sys.executable})
    doc = json.loads(out.stdout)
    assert out.returncode == 0 and doc["ok"], out.stderr[-2000:]
    assert any(d["backend"] == "Vulkan" for d in doc["llama"]["devices"])
    assert doc["plan"]["fits"] and doc["plan"]["n_gpu_layers"] == 31  # fully offloaded
    level = doc["serving"]["levels"]["1"]["everycycle"]
    assert level["errors"] == 0 and level["tok_s"] > 0
    assert doc["governor"]["mode"] == "observe" and doc["governor"]["exit_code"] == 0
    assert "status" in doc["nvml_fixture"]  # unavailable here, with NVML's reason
    probe = doc["row_probe"]["types"]["q4_k_m"]  # on the GPU's kernels: what it found, whatever it is
    assert probe["gpu_layers"] == 999 and set(probe["max_abs_logit_difference_by_rows"]) == {"2", "3"}
