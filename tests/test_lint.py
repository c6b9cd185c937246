"""ruff over the code, the tests, the benchmarks and the image scripts, with pyproject.toml's rules (#57: no linter
was configured while the code carried 27 noqa comments). A finding fails make test, named file:line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_ruff_finds_nothing():
    done = subprocess.run([str(Path(sys.executable).with_name("ruff")), "check", "--no-cache", "--output-format",
                           "concise", "."], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr
