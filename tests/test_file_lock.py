"""common/file_lock.hold: one owner at a time for a process's folder (a serve's run folder)."""

from __future__ import annotations

import os

import pytest

from host_runtime.common.file_lock import InUse, hold


def test_a_held_lock_refuses_another_owner_naming_the_holder_until_it_is_let_go(tmp_path):
    path = tmp_path / "serve.lock"
    fd = hold(path, "--run-dir X")
    assert path.read_text() == f"{os.getpid()}\n" and path.stat().st_mode & 0o777 == 0o600
    with pytest.raises(InUse, match=rf"--run-dir X is in use by another process \(pid {os.getpid()}\)"):
        hold(path, "--run-dir X")  # another open file description: flock refuses it, in this process too
    os.close(fd)
    again = hold(path, "--run-dir X")  # let go: owned anew, the file rewritten
    assert path.read_text() == f"{os.getpid()}\n"
    os.close(again)
