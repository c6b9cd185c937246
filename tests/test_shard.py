"""One model across three boxes (#60): a holder and two members in network namespaces on one bridge, each
member's memory capped below the model's size, so the model fits only across them. The members lend their CPU
through llama.cpp's RPC server behind stunnel's TLS keyed from the fleet key; the holder's `serve --shard-host`
places layers on them. Its greedy output equals the same model's on one box; a peer without the fleet key gets
nothing; a member killed mid-stream ends that stream with an error, the model waits with a 503 saying why, and it
serves again when the member returns."""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import socket
import struct
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from host_runtime.common import settings_file
from host_runtime.fleet.settings import FleetSettings
from host_runtime.gpu.rpc_devices import RPC_PROTOCOL
from host_runtime.serving.settings import ServingSettings
from host_runtime.shard.errors import ShardError
from host_runtime.shard.holder import ShardConfig, Shards
from tests.fleet_hosts import Net
from tests.memory_cap import MemoryCap
from tests.servers import Proc, everycycle, running_serve, wait_for
from tests.tiny_gguf import write_tiny_llama

pytestmark = [pytest.mark.system, pytest.mark.root, pytest.mark.cgroup]

PORT = 50052
MODEL = "shard-llama"
# 12 layers 512 wide, F32: 158 MiB, 13 MiB a layer. Each member lends 80 MiB under a memory cap of 112 (its share,
# the largest tensor in flight, its compute buffers), the holder's models may take 72 MiB of its RAM
# (--models-memory-mib): the model fits only across the three.
N_LAYER = 12
LEND_MIB = 80
CAP_MIB = 112
HOLDER_MIB = 72
SERVE_ARGS = ["--threads", "1", "--ctx-size", "256", "--parallel", "1"]
PROMPTS = ("Hello there, my friend", "A box on the LAN")


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("shard") / f"{MODEL}.gguf", n_ctx=512, n_embd=512,
                            n_layer=N_LAYER, n_head=8, n_ff=1536)


def shard_key(fleet_key: Path, *members: str) -> str:
    """`everycycle fleet shard-key`'s output for these members."""
    return subprocess.run(everycycle("fleet", "shard-key", *(a for m in members for a in ("--member", m)), "--key-file",
                                     str(fleet_key)), capture_output=True, text=True, check=True).stdout


def _key_file(path: Path) -> Path:
    path.write_text(secrets.token_urlsafe(32) + "\n")
    path.chmod(0o600)
    return path


class Members:
    """The two members: `everycycle fleet shard-host` in namespaces 1 and 2, each capped once it lends (the pid
is the member's own: `ip netns exec` execs it)."""

    def __init__(self, net: Net, key: Path, workdir: Path):
        self.net, self.key, self.workdir = net, key, workdir
        self.procs: dict[int, Proc] = {}
        self.caps: dict[int, MemoryCap] = {}
        holder_keys = workdir / "holder.keys"
        holder_keys.write_text(shard_key(key, self.address(1), self.address(2)))
        holder_keys.chmod(0o600)
        self.holder_settings = workdir / "holder-serving.toml"
        settings_file.save(ServingSettings(shard_hosts=(self.address(1), self.address(2)),
                                           shard_key_file=str(holder_keys), models_memory_mib=HOLDER_MIB),
                           self.holder_settings)
        for i in (1, 2):
            self.start(i)

    def address(self, i: int) -> str:
        return f"{self.net.address(i)}:{PORT}"

    def start(self, i: int) -> None:
        """Member 1 holds the fleet key and is given its flags; member 2 runs as supervisord runs it on a
        provisioned box: its settings in fleet.toml, only its own wire key, as `fleet shard-key` prints it."""
        if i == 1:
            argv = ["--listen", self.address(i), "--key-file", str(self.key), "--lend-mib", str(LEND_MIB)]
        else:
            own = self.workdir / f"member{i}.wire-key"
            own.write_text(shard_key(self.key, self.address(i)))
            own.chmod(0o600)
            settings = self.workdir / f"member{i}-fleet.toml"
            settings_file.save(FleetSettings(role="member", shard_listen=self.address(i), shard_lend_mib=LEND_MIB,
                                             shard_wire_key_file=str(own)), settings)
            argv = ["--if-lending", "--settings", str(settings)]
        argv = self.net.run_in(i, everycycle("fleet", "shard-host", *argv, "--threads", "1"))
        proc = self.procs[i] = Proc(argv, self.workdir / f"member{i}.log")
        wait_for(lambda: "lending CPU" in proc.log(), 60, f"member {i} lending", proc)
        if i in self.caps:
            self.caps[i].lift()
        self.caps[i] = MemoryCap(proc.popen.pid, CAP_MIB << 20, f"ecshard{os.getpid()}-{i}")

    def inner_ports(self, i: int) -> list[tuple[str, int]]:
        """What member i's namespace listens on besides PORT (its llama.cpp RPC server and its facts), read from
        /proc/PID/net/tcp, which is the member's namespace's table."""
        listening = set()
        for line in Path(f"/proc/{self.procs[i].popen.pid}/net/tcp").read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            if state == "0A":  # LISTEN
                address, port = local.split(":")
                listening.add((socket.inet_ntoa(struct.pack("<I", int(address, 16))), int(port, 16)))
        return sorted(entry for entry in listening if entry[1] != PORT)

    def kill(self, i: int) -> None:
        os.killpg(self.procs[i].popen.pid, signal.SIGKILL)
        self.procs[i].popen.wait()

    def stop(self) -> None:
        for proc in self.procs.values():
            proc.stop()
        for cap in self.caps.values():
            cap.lift()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, model):
    workdir = tmp_path_factory.mktemp("shard-fleet")
    net = Net(3)
    members = None
    try:
        members = Members(net, _key_file(workdir / "fleet.key"), workdir)
        yield net, members
    finally:
        if members is not None:
            members.stop()
        net.remove()


def _get(url: str, timeout: float = 30) -> tuple[int, dict]:
    """(status, JSON body); (0, {}) while nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")
    except OSError:
        return 0, {}


def _complete(base: str, prompt: str, **extra) -> urllib.request.Request:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 24, "temperature": 0, "logprobs": 1, **extra}
    return urllib.request.Request(base + "/v1/completions", data=json.dumps(body).encode(),
                                  headers={"Content-Type": "application/json"})


def _greedy(base: str) -> list[tuple[str, list[float]]]:
    out = []
    for prompt in PROMPTS:
        with urllib.request.urlopen(_complete(base, prompt), timeout=120) as resp:
            choice = json.loads(resp.read())["choices"][0]
        out.append((choice["text"], choice["logprobs"]["token_logprobs"]))
    return out


def _hello_answered(address: str, port: int) -> bool:
    """Whether a plain TCP peer sending llama.cpp's HELLO gets an answer (of any size)."""
    try:
        with socket.create_connection((address, port), timeout=5) as sock:
            sock.sendall(struct.pack("<BQ", 14, 24) + bytes(24))
            return len(sock.recv(8)) > 0
    except OSError:
        return False


def test_a_peer_without_the_fleet_key_reaches_nothing(fleet, tmp_path):
    net, members = fleet
    member = members.address(1)
    # Plain TCP, as llama.cpp's own client would speak it: stunnel wants TLS and closes the connection.
    assert not _hello_answered(net.address(1), PORT)
    # The RPC server and the facts listen on the member's loopback alone: from the LAN their ports are closed.
    inner = members.inner_ports(1)
    assert len(inner) == 2 and {address for address, _ in inner} == {"127.0.0.1"}, inner
    for _, port in inner:
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((net.address(1), port), timeout=5).close()
    # TLS keyed from another fleet's key: the handshake fails, named as such.
    stranger = Shards(ShardConfig(hosts=(member,), key_file=str(_key_file(tmp_path / "other.key"))))
    try:
        with pytest.raises(ShardError, match="fleet key differs"):
            stranger.attach()
    finally:
        stranger.stop()
    assert not stranger.devices
    # The fleet's key opens it, and the member speaks this llama.cpp's protocol.
    from host_runtime.shard.probe import hello

    ours = Shards(ShardConfig(hosts=(member,), key_file=str(members.key)))
    try:
        assert hello("127.0.0.1", ours.members[member][0], member=member)[:2] == RPC_PROTOCOL
    finally:
        ours.stop()


def test_the_plan_splits_the_model_only_with_the_members(fleet, model):
    net, members = fleet
    common = ["plan", "--model", str(model), "--ctx-size", "256", "--parallel", "1", "--models-memory-mib",
              str(HOLDER_MIB), "--json"]
    alone = subprocess.run(everycycle(*common), capture_output=True, text=True, timeout=120)
    assert alone.returncode == 1 and "the models' budget" in alone.stderr, alone.stderr
    split = subprocess.run(everycycle(*common, "--shard-key-file", str(members.key), "--shard-host",
                                      members.address(1), "--shard-host", members.address(2)),
                           capture_output=True, text=True, timeout=120)
    assert split.returncode == 0, split.stderr
    doc = json.loads(split.stdout)
    assert doc["fits"] and doc["proven"] and set(doc["device_order"]) == {"RPC0", "RPC1"}
    shares = {s["device"]: s for s in doc["devices"]}
    assert {shares["RPC0"]["description"], shares["RPC1"]["description"]} == {f"{members.address(i)} CPU"
                                                                            for i in (1, 2)}
    assert all(shares[d]["free_bytes"] == LEND_MIB << 20 and shares[d]["margin_bytes"] == 0 for d in ("RPC0", "RPC1"))
    assert shares["CPU"]["used_bytes"] <= HOLDER_MIB << 20
    # The box's own view (plan --fleet): serving.toml's shard hosts, their wire keys and the models' budget.
    fleet_plan = subprocess.run(everycycle("plan", "--model", str(model), "--ctx-size", "256", "--parallel", "1",
                                           "--json", "--fleet", "--settings", str(members.holder_settings)),
                                capture_output=True, text=True, timeout=120)
    assert fleet_plan.returncode == 0, fleet_plan.stderr
    assert json.loads(fleet_plan.stdout)["device_order"] == doc["device_order"]


@pytest.fixture(scope="module")
def holder(fleet, model, tmp_path_factory):
    net, members = fleet
    run_dir = tmp_path_factory.mktemp("shard-holder")
    # as provisioned: serving.toml names the members and a file of their wire keys (no fleet key)
    argv = net.run_in(0, everycycle("serve", "--host", net.address(0), "--port", "8080", "--run-dir", str(run_dir),
                                    "--model", str(model), "--settings", str(members.holder_settings), *SERVE_ARGS))
    proc = Proc(argv, run_dir / "serve.log")
    base = f"http://{net.address(0)}:8080"
    try:
        wait_for(lambda: _get(base + "/ready", 5)[0] == 200, 120, "the holder ready", proc)
        yield base, proc
    finally:
        proc.stop()


def test_the_split_model_answers_as_one_box_does(fleet, holder, model, tmp_path):
    net, members = fleet
    base, proc = holder
    charged = {i: members.caps[i].usage() for i in (1, 2)}
    # The layers are on the members: each holds a fifth of the model or more, under a cap the whole model would
    # not fit.
    assert all(c > model.stat().st_size * 0.2 for c in charged.values()), charged
    log = proc.log()
    # The planner spread it over all three (the placement's table: each member's lent CPU by its address, and the
    # holder's own CPU with layers of its own).
    assert re.search(rf"^RPC0 \({re.escape(members.address(1))} CPU\)\s+\d+-\d+", log, re.M), log[-3000:]
    assert re.search(rf"^RPC1 \({re.escape(members.address(2))} CPU\)\s+\d+-\d+", log, re.M), log[-3000:]
    assert re.search(r"^CPU\s+\d+-\d+", log, re.M), log[-3000:]
    # One model in the box's capability map, with the boxes lending it devices and each link as measured.
    status, caps = _get(base + "/v1/everycycle/capabilities")
    (served,) = caps["models"]
    assert status == 200 and served["id"] == MODEL, caps
    assert {s["host"]: s["devices"] for s in served["shard_hosts"]} == {members.address(1): ["RPC0"],
                                                                        members.address(2): ["RPC1"]}
    assert all(s["round_trip_ms"] > 0 and s["mbytes_per_s"] > 0 for s in served["shard_hosts"])
    split = _greedy(base)
    # One box batching as the split does: mixed batches (a model across boxes batches as llama-server --rpc does;
    # one box's default is the invariant mode, with other attention kernels).
    with running_serve(["--model", str(model), "--mixed-batches", *SERVE_ARGS], tmp_path, "one box") as (one_box, _):
        alone = _greedy(one_box)
    assert split == alone and all(text for text, _ in split)


def test_a_member_gone_mid_stream_ends_it_and_the_model_returns_with_it(fleet, holder):
    net, members = fleet
    base, proc = holder
    before = _greedy(base)
    request = _complete(base, PROMPTS[0], max_tokens=400, stream=True)
    with urllib.request.urlopen(request, timeout=120) as resp:
        assert b"data:" in resp.readline()
        members.kill(2)
        rest = resp.read().decode()
    assert '"engine_unavailable"' in rest, rest[-2000:]
    # The engine ggml ended comes back waiting for the member, saying so.
    status, body = wait_for(lambda: (lambda r: r if "waiting for the shard hosts" in r[1].get("reason", "") else None)(
        _get(base + "/ready", 5)), 60, "the holder waiting for its member", proc)
    assert status == 503 and members.address(2) in body["reason"], body
    # A request meanwhile: a 503 at once, saying why, never a hang.
    try:
        urllib.request.urlopen(_complete(base, PROMPTS[0]), timeout=30)
        raise AssertionError("a request was answered without the member")
    except urllib.error.HTTPError as exc:
        error = json.loads(exc.read())["error"]
        assert exc.code == 503 and members.address(2) in error["message"], error
        assert exc.headers.get("Retry-After"), dict(exc.headers)
    members.start(2)
    wait_for(lambda: _get(base + "/ready", 5)[0] == 200, 90, "the holder serving again", proc)
    assert _greedy(base) == before
