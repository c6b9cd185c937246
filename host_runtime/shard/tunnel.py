"""stunnel run for the RPC wire: its configuration and secrets in a private folder, the process kept as a child
of whoever needs the wire (the shard host, or the engine holding the model), gone with it."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from host_runtime.common.processes import die_with_parent, stop_process
from host_runtime.shard.errors import ShardError

START_TIMEOUT_S = 10.0


def stunnel_binary() -> str:
    found = shutil.which("stunnel4") or shutil.which("stunnel") or (
        "/usr/bin/stunnel4" if os.access("/usr/bin/stunnel4", os.X_OK) else None)
    if not found:
        raise ShardError("stunnel is not installed (Debian's stunnel4): the RPC wire between boxes needs it")
    return found


def listening_ports(pid: int) -> set[int]:
    """The TCP ports process pid listens on (asked of the kernel: a test connection would be a TLS error in the
    member's log)."""
    import psutil

    try:
        return {c.laddr.port for c in psutil.Process(pid).net_connections(kind="tcp") if c.status == "LISTEN"}
    except psutil.Error:
        return set()


def wait_listening(pid: int, ports: set[int], running: Callable[[], bool], timeout: float) -> bool:
    """Until process pid listens on every port of `ports` (True), or it stops `running` or the time is up."""
    deadline = time.monotonic() + timeout
    while not ports <= listening_ports(pid):
        if not running() or time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


class Tunnel:
    def __init__(self, conf: Callable[[str, str], str], secrets: str, ports: list[int],
                 parent_dir: str | None = None):
        """Start stunnel with conf(secrets_file, log_file)'s configuration; return once it listens on every port
        of `ports`; ShardError with its log's last lines if it does not."""
        self.dir = Path(tempfile.mkdtemp(prefix="everycycle-shard-", dir=parent_dir))  # 0700
        secrets_file, self.log_file = self.dir / "psk.txt", self.dir / "stunnel.log"
        fd = os.open(secrets_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(secrets)
        conf_file = self.dir / "stunnel.conf"
        conf_file.write_text(conf(str(secrets_file), str(self.log_file)))
        self.proc = subprocess.Popen([stunnel_binary(), str(conf_file)], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                                     preexec_fn=die_with_parent)
        if not wait_listening(self.proc.pid, set(ports), self.alive, START_TIMEOUT_S):
            tail = self.log_tail()
            self.stop()
            raise ShardError(f"stunnel did not start: {tail or 'no log'}")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, lines: int = 3) -> str:
        try:
            text = self.log_file.read_text(errors="replace")
        except OSError:
            return ""
        return " | ".join(line.split(": ", 1)[-1] for line in text.strip().splitlines()[-lines:])

    def stop(self) -> None:
        stop_process(self.proc, timeout=5)
        shutil.rmtree(self.dir, ignore_errors=True)
