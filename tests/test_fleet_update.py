"""`everycycle fleet update`: the members updated one at a time. The command runs for real (its polls over HTTP with
the fleet key, its SSH command line); the members are stand-ins, said so: capability maps served on loopback
addresses of their own (127.0.0.2, ...), and an `ssh` first on PATH that records the call and plays the member's
update (draining while it writes, gone while it reboots, back on the new version blessed, or rolled back)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import time
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from host_runtime.fleet.capabilities import Capabilities, GovernorView, ModelCapability
from host_runtime.fleet.rollout import DONE, START, STOPPED, BoxView, Rollout, Step
from host_runtime.fleet.rollout_run import drive, ssh_argv
from tests.servers import everycycle

OLD, NEW = "2026.12.04", "2026.12.05"
KEY = "ec-" + "k" * 43


class StandInMember:
    """A member's capability map on its own loopback address; update() plays what `update apply --reboot` does."""

    def __init__(self, address: str, outcome: str = "blessed"):
        self.outcome = outcome
        self.caps: Capabilities | None = Capabilities(box=f"box-{address}", version=OLD,
                                                     governor=GovernorView("normal", 0),
                                                     models=(ModelCapability("m", "loaded"),), slot="A",
                                                     update_target=OLD, update_phase="blessed")
        member = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                if self.headers.get("Authorization") != f"Bearer {KEY}":
                    self.send_response(401)
                    self.end_headers()
                    return
                caps = member.caps
                body = json.dumps(caps.to_wire()).encode() if caps else b"{}"
                self.send_response(200 if caps else 503)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer((address, 0), Handler)
        self.url = f"http://{address}:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def update(self) -> None:
        """Copy and write (draining), reboot (gone), then the health gate's verdict."""
        def play():
            self.caps = replace(self.caps, draining=True, draining_reason=f"update to {NEW} is writing",
                                update_target=NEW, update_phase="writing")
            time.sleep(0.4)
            self.caps = None
            time.sleep(0.4)
            if self.outcome == "blessed":
                self.caps = replace(self.caps_before, version=NEW, slot="B", update_target=NEW, update_phase="blessed")
            else:
                self.caps = replace(self.caps_before, update_target=NEW, update_phase="rolled-back",
                                    update_reason="the health gate failed: serving never became ready")
        self.caps_before = self.caps
        threading.Thread(target=play, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def members():
    made: list[StandInMember] = []

    def make(*outcomes: str) -> list[StandInMember]:
        made.extend(StandInMember(f"127.0.0.{i + 2}", outcome) for i, outcome in enumerate(outcomes))
        return made

    yield make
    for m in made:
        m.close()


def run_update(tmp_path: Path, members: list[StandInMember]) -> tuple[subprocess.CompletedProcess, list[str]]:
    """`everycycle fleet update` with a stand-in ssh: each call is logged, and the member it names updates."""
    key_file = tmp_path / "fleet.key"
    key_file.write_text(KEY + "\n")
    key_file.chmod(0o600)
    settings = tmp_path / "fleet.toml"
    settings.write_text(f'role = "gateway"\npeers = {json.dumps(["http://127.0.0.1:8081", *(m.url for m in members)])}'
                        f'\nkey_file = "{key_file}"\n')
    ssh_key = tmp_path / "id_ed25519"
    ssh_key.write_text("a private key\n")
    calls = tmp_path / "calls"
    calls.mkdir()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text(f"#!/bin/sh\necho \"$@\" >> {calls}/log\ntouch {calls}/\"$(echo \"$@\" | grep -o "
                                 "'root@[0-9.]*' | cut -d@ -f2)\"\nexit 0\n")
    (bin_dir / "ssh").chmod(0o755)
    by_address = {m.url.split("//")[1].split(":")[0]: m for m in members}
    done = threading.Event()

    def play_calls():  # the stand-in for sshd and `update apply --reboot` on each member
        seen: set[str] = set()
        while not done.is_set():
            for f in calls.iterdir():
                if f.name in by_address and f.name not in seen:
                    seen.add(f.name)
                    by_address[f.name].update()
            time.sleep(0.05)

    player = threading.Thread(target=play_calls, daemon=True)
    player.start()
    try:
        out = subprocess.run(everycycle("fleet", "update", "--settings", str(settings), "--from",
                                        "http://10.0.0.9/release/", "--target", NEW, "--ssh-key", str(ssh_key),
                                        "--known-hosts", str(tmp_path / "known_hosts"), "--interval", "0.1"),
                             capture_output=True, text=True, timeout=120,
                             env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"})
    finally:
        done.set()
        player.join(5)
    log = (calls / "log").read_text().splitlines() if (calls / "log").exists() else []
    return out, log


@pytest.mark.system  # the command runs as a process
def test_the_members_update_one_at_a_time_each_back_and_blessed_before_the_next(tmp_path, members):
    boxes = members("blessed", "blessed", "blessed")
    out, log = run_update(tmp_path, boxes)
    assert out.returncode == 0, out.stdout + out.stderr
    assert [re.search(r"root@\S+", line).group(0) for line in log] == ["root@127.0.0.2", "root@127.0.0.3", "root@127.0.0.4"]
    assert log[0].endswith("root@127.0.0.2 everycycle update apply --from http://10.0.0.9/release/ --reboot")
    assert all(m.caps.version == NEW and m.caps.slot == "B" for m in boxes)
    lines = out.stdout.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("start ")]
    assert len(starts) == 3 and lines[-1] == f"done: every box runs {NEW}"
    # Between two starts the rollout saw the first box draining, gone, and back: one box at a time.
    assert any("rebooting (not answering)" in line for line in lines[starts[0]:starts[1]])


@pytest.mark.system  # the command runs as a process
def test_the_rollout_stops_at_the_first_box_that_rolls_back_and_leaves_the_rest(tmp_path, members):
    boxes = members("blessed", "rolled-back", "blessed")
    out, log = run_update(tmp_path, boxes)
    assert out.returncode == 1
    assert [re.search(r"root@\S+", line).group(0) for line in log] == ["root@127.0.0.2", "root@127.0.0.3"]   # the third never asked
    assert out.stdout.splitlines()[-1] == (f"stopped {boxes[1].url}: its update to {NEW} rolled-back: the health "
                                           f"gate failed: serving never became ready")
    assert boxes[2].caps.version == OLD


def test_the_ssh_command_checks_host_keys_and_never_prompts():
    argv = ssh_argv("https://10.0.0.3:8443", "http://10.0.0.9/rel ease/", "/root/.ssh/fleet", "/root/.ssh/known_hosts")
    assert argv[:2] == ["ssh", "-i"] and "BatchMode=yes" in argv and "StrictHostKeyChecking=accept-new" in argv
    assert argv[-2:] == ["root@10.0.0.3", "everycycle update apply --from 'http://10.0.0.9/rel ease/' --reboot"]


def test_a_start_that_fails_stops_the_rollout_with_its_reason():
    caps = Capabilities(box="a", version=OLD, governor=GovernorView("normal", 0), models=())
    rollout = Rollout(NEW, ("https://a",))
    steps: list[Step] = []

    class Refused:
        def failed(self):
            return "`ssh root@a ...` exited 1: the release is not newer than 2026.12.04"

    clock = iter(range(100))
    last = drive(rollout, lambda: [BoxView("https://a", caps)], lambda box: Refused(), steps.append,
                 clock=lambda: next(clock), sleep=lambda s: None)
    assert [s.action for s in steps] == [START, STOPPED]   # found at the next poll
    assert last.why.endswith("not newer than 2026.12.04")
    assert DONE not in [s.action for s in steps]
