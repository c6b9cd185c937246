"""`everycycle fleet update` (I/O): a rolling update of the fleet's members, driven from the gateway.

The decisions are rollout.py's. Each member is read through its capability map (the gateway's poll: HTTPS, the
fleet key, the peer certificates) and started over SSH as root, the way an owner updates one box by hand:
`everycycle update apply --from URL --reboot` (the member verifies the release with its own update key, drains
while it copies and writes, reboots, and its health gate blesses the new slot or the boot loader rolls back). The
members' bundles authorize the owner's SSH key (`[ssh] authorized_keys`); the host keys are checked against
`known_hosts` (OpenSSH's own file; `accept-new` remembers a member's key the first time).
"""

from __future__ import annotations

import shlex
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit

from host_runtime.fleet.peers import poll_all
from host_runtime.fleet.rollout import DONE, START, STOPPED, BoxView, Rollout, Step

POLL_TIMEOUT_S = 3.0


def ssh_argv(box: str, source: str, key_file: str, known_hosts: str, connect_timeout_s: int = 10) -> list[str]:
    """The command that starts `box`'s update (pure): root@ its front's host, batch mode (never a prompt)."""
    host = urlsplit(box).hostname
    remote = f"everycycle update apply --from {shlex.quote(source)} --reboot"
    return ["ssh", "-i", key_file, "-o", "BatchMode=yes", "-o", f"ConnectTimeout={connect_timeout_s}",
            "-o", f"UserKnownHostsFile={known_hosts}", "-o", "StrictHostKeyChecking=accept-new",
            f"root@{host}", remote]


# What ssh says when it never reached the member's shell (exit 255 then; a reboot dropping the session is 255 too).
SSH_NEVER_RAN = ("Permission denied", "Host key verification failed", "Connection refused", "Could not resolve",
                 "Connection timed out", "No route to host")


class SSHStart:
    """A member's update started over SSH, in the background: the session ends when the box reboots."""

    def __init__(self, argv: list[str]):
        self.argv = argv
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True)
        self._out: str | None = None

    def failed(self) -> str | None:
        """Why the start failed (SSH never reached the box, or the box refused the release before writing), or
        None while it runs or where it ended as a reboot ends a session: the box's map says the rest."""
        code = self.proc.poll()
        if code is None or code == 0:
            return None
        if self._out is None:
            self._out = self.proc.stdout.read() if self.proc.stdout else ""
        if code == 255 and not any(marker in self._out for marker in SSH_NEVER_RAN):
            return None
        return f"`{' '.join(self.argv[-2:])}` exited {code}: {self._out[-600:].strip()}"


def drive(rollout: Rollout, read, start, say, interval_s: float = 5.0, clock=time.monotonic,
          sleep=time.sleep) -> Step:
    """Poll (read() -> [BoxView]), decide, start (start(box) -> a handle with failed()), until done or stopped;
    say(text) reports each change of step. Returns the last step."""
    handle, last = None, None
    while True:
        now = clock()
        views = read()
        step = rollout.next_step(views, now)
        if handle is not None and step.box == rollout.current and step.action not in (DONE, STOPPED):
            why = handle.failed()
            if why:
                step = Step(STOPPED, rollout.current, why)
        if step != last:
            say(step)
            last = step
        if step.action in (DONE, STOPPED):
            return step
        if step.action == START:
            handle = start(step.box)
            rollout.started(step.box, views, now)
        sleep(interval_s)


def reader(boxes: tuple[str, ...], key: str, client, pool: ThreadPoolExecutor):
    """read() for drive(): every box's map at once (peers.poll_all, the gateway's own polls)."""
    def read() -> list[BoxView]:
        return [BoxView(r.box, r.caps) for r in poll_all(boxes, key, POLL_TIMEOUT_S, pool, client)]

    return read


def default_known_hosts() -> str:
    return str(Path.home() / ".ssh" / "known_hosts")
