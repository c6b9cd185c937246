"""Several boxes on one machine, for the fleet's tests and bench/fleet.py: network namespaces the test makes, each
with a veth on one bridge in the root namespace (which has an address there too, so the test reaches every box),
each running `everycycle serve` on 1 thread; the first box is the gateway (its API behind the front, plus the
router and its controller). The boxes in `behind_front` are members as shipped: their API behind their own front
(HTTPS, their local CA's certificate the gateway is given, the gateway's address exempt from per-client limits); the
others expose `serve` on plain HTTP. Everything is removed at the end, processes first."""

from __future__ import annotations

import json
import os
import random
import shutil
import ssl
import subprocess
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from host_runtime.fleet.settings import FleetSettings
from tests.servers import Proc, everycycle, wait_for

SMOL = "SmolLM2-135M-Instruct.Q4_1"


def _ip(*args: str, ns: str | None = None) -> None:
    cmd = ["ip", *(("netns", "exec", ns, "ip") if ns else ()), *args]
    subprocess.run(cmd, check=True, capture_output=True)


class Net:
    """A bridge and `count` namespaces on it: host i has address PREFIX.(i+2); the root namespace PREFIX.1."""

    def __init__(self, count: int):
        tag = f"{os.getpid() % 1000}{random.randrange(100)}"
        self.prefix = f"10.{random.randrange(200, 250)}.{random.randrange(1, 250)}"
        self.bridge = f"ecbr{tag}"
        self.names = [f"ecfl{tag}-{i}" for i in range(count)]
        self._veths = [f"ecv{tag}h{i}" for i in range(count)]
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{self.prefix}.1/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for i, (ns, veth) in enumerate(zip(self.names, self._veths)):
                subprocess.run(["ip", "netns", "add", ns], check=True)
                _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
                _ip("link", "set", veth, "master", self.bridge, "up")
                _ip("addr", "add", f"{self.address(i)}/24", "dev", "eth0", ns=ns)
                _ip("link", "set", "eth0", "up", ns=ns)
                _ip("link", "set", "lo", "up", ns=ns)
        except BaseException:
            self.remove()
            raise

    def address(self, i: int) -> str:
        return f"{self.prefix}.{i + 2}"

    def run_in(self, i: int, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.names[i], *argv]

    def remove(self) -> None:
        for ns in self.names:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)


@dataclass
class Box:
    index: int
    base: str            # how the gateway's router reaches its API
    proc: Proc
    models: list[str]
    argv: list[str]      # to start it again
    front: Proc | None = None  # a member behind its own front
    certificate: Path | None = None

    def get(self, path: str, key: str) -> tuple[int, str]:
        """GET from the root namespace (not for the gateway's own box, whose API is on its loopback)."""
        context = ssl.create_default_context(cafile=str(self.certificate)) if self.certificate else None
        req = urllib.request.Request(self.base + path, headers={"Authorization": f"Bearer {key}"})
        try:
            with urllib.request.urlopen(req, timeout=10, context=context) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()


@dataclass
class Fleet:
    net: Net
    workdir: Path
    client_key: str
    fleet_key: str
    boxes: list[Box] = field(default_factory=list)
    front: Proc | None = None
    gateway: Proc | None = None
    https_port: int = 8443
    state_file: Path | None = None

    @property
    def url(self) -> str:
        return f"https://{self.net.address(0)}:{self.https_port}"

    @property
    def certificate(self) -> Path:
        return self.workdir / "gw-state" / "tls" / "ca.crt"

    def tls(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.certificate))

    def state(self) -> dict:
        try:
            return json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return {}

    def registered(self) -> set[tuple[str, str]]:
        """(box base URL, model) pairs the router has as workers, from the gateway's state file."""
        return {(r["url"].rsplit("/fleet/", 1)[0], r["model_id"]) for r in self.state().get("registered", [])}

    def stop(self) -> None:
        for proc in [self.gateway, self.front, *(b.front for b in self.boxes), *(b.proc for b in self.boxes)]:
            if proc is not None:
                proc.stop()
        self.net.remove()


def _key_file(path: Path, key: str) -> Path:
    path.write_text(key + "\n")
    path.chmod(0o600)
    return path


def start_fleet(workdir: Path, box_models: list[str | None], *, policy: str = "cache_aware", parallel: int = 4,
                max_queue: int = 64, ctx_size: int = 1024, poll_interval: float = 0.5,
                governor_state: bool = False, behind_front: tuple[int, ...] = (),
                trace_port: int | None = None) -> Fleet:
    """Boxes in namespaces; box_models[i] is a GGUF path box i serves (None: the built-in model). Box 0 is the
    gateway. Returns once every box is ready and the router has a worker for each box's model. With `trace_port`,
    every box's API sends its spans to an OTLP collector on that port of the root namespace."""
    net = Net(len(box_models))
    fleet = None
    try:
        client_keys = workdir / "client_keys.json"
        client_key = subprocess.run(everycycle("keys", "create", "--keys", str(client_keys), "client"),
                                    capture_output=True, text=True, check=True).stdout.strip()
        fleet_key = subprocess.run(everycycle("keys", "create", "--keys", str(workdir / "fleet_made.json"), "fleet"),
                                   capture_output=True, text=True, check=True).stdout.strip()
        key_file = _key_file(workdir / "fleet.key", fleet_key)
        fleet = Fleet(net, workdir, client_key, fleet_key, state_file=workdir / "fleet-state.json")
        for i, model in enumerate(box_models):
            keys = workdir / f"box{i}_keys.json"
            if i == 0:  # the gateway's own API takes the clients' keys (the front asks it) and the fleet key
                shutil.copy(client_keys, keys)
            subprocess.run(everycycle("keys", "import", "--keys", str(keys), "--key-file", str(key_file), "fleet"),
                           check=True, capture_output=True)
            common = ["--keys", str(keys), "--threads", "1", "--workers", "1", "--ctx-size", str(ctx_size),
                      "--parallel", str(parallel), "--max-queue", str(max_queue),
                      "--model-store", str(workdir / f"box{i}_store"), "--run-dir", str(workdir / f"box{i}_run")]
            if model:
                common += ["--model", model]
            if trace_port is not None:  # the root namespace's address on the bridge
                common += ["--trace-endpoint", f"http://{net.prefix}.1:{trace_port}"]
            if governor_state:  # a file the test writes to play the governor
                common += ["--governor-state", str(workdir / f"box{i}_governor.json")]
            if i == 0:
                listen = ["--unix-socket", str(workdir / "box0_api" / "http.sock"), "--also-listen", "127.0.0.1:8081",
                          "--fleet-router", f"127.0.0.1:{FleetSettings().router_port}"]   # fleet.toml's default
                base = "http://127.0.0.1:8081"
            elif i in behind_front:
                listen = ["--unix-socket", str(workdir / f"box{i}_api" / "http.sock")]
                base = f"https://{net.address(i)}:8443"
            else:
                listen = ["--host", net.address(i), "--port", "8080"]
                base = f"http://{net.address(i)}:8080"
            argv = net.run_in(i, everycycle("serve", *listen, *common))
            name = Path(model).stem if model else SMOL
            box = Box(i, base, Proc(argv, workdir / f"box{i}.log"), [name], argv)
            fleet.boxes.append(box)
            if i in behind_front and i != 0:
                member_toml = workdir / f"box{i}_front.toml"
                member_toml.write_text(f'listen = "{net.address(i)}"\nhttp = "off"\n'
                                       f'fleet_gateway = "{net.address(0)}"\n')
                box.certificate = workdir / f"box{i}_state" / "tls" / "ca.crt"  # its local CA
                box.front = Proc(net.run_in(i, everycycle(
                    "front", "run", "--settings", str(member_toml), "--state-dir", str(workdir / f"box{i}_state"),
                    "--run-dir", str(workdir / f"box{i}_front"),
                    "--upstream-socket", str(workdir / f"box{i}_api" / "http.sock"))), workdir / f"box{i}_front.log")
        for box in fleet.boxes:
            check = (lambda b=box: _ready(net, 0, b.base)) if box.index == 0 else (lambda b=box: _ready_from_root(b))
            wait_for(check, 120, f"box {box.index} ready", box.proc)
        fleet_toml = workdir / "fleet.toml"
        certificates = [str(b.certificate) for b in fleet.boxes if b.certificate]
        fleet_toml.write_text(f'role = "gateway"\npeers = {json.dumps([b.base for b in fleet.boxes])}\n'
                              f'policy = "{policy}"\nkey_file = "{key_file}"\npoll_interval_s = {poll_interval}\n'
                              f'peer_certificates = {json.dumps(certificates)}\n')
        front_toml = workdir / "front.toml"
        front_toml.write_text(f'listen = "{net.address(0)}"\nhttp = "off"\nconnections_per_client = 1024\n'
                              f'requests_per_second_per_client = 1000\nrequest_burst_per_client = 1000\n')
        fleet.front = Proc(net.run_in(0, everycycle("front", "run", "--settings", str(front_toml),
                                                    "--state-dir", str(workdir / "gw-state"),
                                                    "--run-dir", str(workdir / "gw-front"),
                                                    "--upstream-socket", str(workdir / "box0_api" / "http.sock"),
                                                    "--fleet-settings", str(fleet_toml))), workdir / "front.log")
        fleet.gateway = Proc(net.run_in(0, everycycle("fleet", "gateway", "--settings", str(fleet_toml),
                                                      "--state", str(fleet.state_file))), workdir / "gateway.log")
        want = {(b.base, m) for b in fleet.boxes for m in b.models}
        wait_for(lambda: want <= fleet.registered(), 60, f"the router's workers {sorted(want)}", fleet.gateway)
        wait_for(lambda: fleet.certificate.exists(), 30, "the front's certificate", fleet.front)
        return fleet
    except BaseException:
        if fleet is not None:
            fleet.stop()
        else:
            net.remove()
        raise


def _ready(net: Net, index: int, base: str) -> bool:
    # The gateway's own API listens on its namespace's loopback: ask from inside.
    out = subprocess.run(net.run_in(index, ["curl", "-sf", "-o", "/dev/null", base + "/ready"]), capture_output=True)
    return out.returncode == 0


def _ready_from_root(box: Box) -> bool:
    if box.certificate is not None and not box.certificate.exists():
        return False
    try:
        return box.get("/ready", "")[0] == 200
    except OSError:
        return False


def box_metric(fleet: Fleet, index: int, name: str) -> float:
    """A metric summed over its labels, read from box `index`'s /metrics with the fleet key."""
    from tests.servers import metric_value

    box = fleet.boxes[index]
    if index == 0:
        out = subprocess.run(fleet.net.run_in(0, ["curl", "-sf", "-H", f"Authorization: Bearer {fleet.fleet_key}",
                                                  box.base + "/metrics"]), capture_output=True, text=True)
        text = out.stdout
    else:
        status, text = box.get("/metrics", fleet.fleet_key)
        assert status == 200, (status, text)
    try:
        return metric_value(text, name)
    except KeyError:
        return 0.0
