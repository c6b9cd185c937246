"""mypy over the typed core (#57: no type checker was configured), with pyproject.toml's [tool.mypy]: its files and
settings. A finding fails make test, named file:line; a module joins the list once it has none."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_mypy_finds_nothing_in_the_typed_core():
    done = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental", "--python-executable", sys.executable],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "Success: no issues found" in done.stdout
