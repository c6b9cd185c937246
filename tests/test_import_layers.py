"""The layers point down only (#57): pyproject.toml's import-linter contract, over every import (those inside
functions too: grimp reads them), holds for the tree; and it is a check that can fail: an upward import planted in
a copy of the tree breaks it, naming the import."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINT = Path(sys.executable).with_name("lint-imports")
PACKAGES = ("host_runtime", "agent_bmc", "provisioning")


def lint(where: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(LINT), "--no-cache"], cwd=where, capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": str(where), "PATH": "/usr/bin:/bin"})


def test_every_import_points_down_the_layers():
    done = lint(ROOT)
    assert done.returncode == 0 and "1 kept, 0 broken" in done.stdout, done.stdout[-3000:] + done.stderr


def test_an_upward_import_planted_in_a_function_breaks_the_contract(tmp_path):
    for package in PACKAGES:
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__", "*.json"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    with open(tmp_path / "host_runtime/engine/limits.py", "a") as f:  # the engine reaching up into the API
        f.write("\n\ndef planted():\n    from host_runtime.serving import app\n    return app\n")
    done = lint(tmp_path)
    assert done.returncode == 1 and "0 kept, 1 broken" in done.stdout, done.stdout[-3000:] + done.stderr
    assert "host_runtime.engine is not allowed to import host_runtime.serving" in done.stdout
    assert "host_runtime.engine.limits -> host_runtime.serving.app" in done.stdout
