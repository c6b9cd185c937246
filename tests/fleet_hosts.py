"""Several boxes on one machine, for the fleet's tests and bench/fleet.py: network namespaces the test makes, each
with a veth on one bridge in the root namespace (which has an address there too, so the test reaches every box),
each running `everycycle serve` on 1 thread; the first box is the gateway (its API behind the front, plus the
router and its controller). The boxes in `behind_front` are members as shipped: their API behind their own front
(HTTPS, their local CA's certificate the gateway is given, the gateway's address exempt from per-client limits); the
others expose `serve` on plain HTTP. Everything is removed at the end, processes first."""

from __future__ import annotations

import itertools
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


_NET_TAGS = itertools.count(random.randrange(100))


def _ip(*args: str, ns: str | None = None) -> None:
    cmd = ["ip", *(("netns", "exec", ns, "ip") if ns else ()), *args]
    subprocess.run(cmd, check=True, capture_output=True)


class Net:
    """A bridge and `count` namespaces on it: host i has address PREFIX.(i+2); the root namespace PREFIX.1."""

    def __init__(self, count: int):
        # Names not reused within a process: a namespace's veth goes away after `ip netns del` returns (the kernel
        # cleans namespaces up in the background), and a Net drawing the same random tag as the one before it
        # met its host end still there ("RTNETLINK answers: File exists", seen once in make test).
        tag = f"{os.getpid() % 1000}{next(_NET_TAGS) % 100:02d}"
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
    quota: object = None       # image.cpu_quota.CpuQuota: a slower box (bench/fleet.py --fleet hetero)

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
class GatewaySide:
    """One gateway's programs on its box: the front (the clients' door), the router and its controller, and with a
    virtual address keepalived holding it (`everycycle fleet address`)."""

    index: int
    state_dir: Path      # the front's: its local CA is state_dir/tls/ca.crt
    state_file: Path     # what the gateway sees and did, each poll
    front: Proc | None = None
    gateway: Proc | None = None
    address: Proc | None = None
    argv: dict = field(default_factory=dict)  # name -> (argv, log): to start each again

    @property
    def certificate(self) -> Path:
        return self.state_dir / "tls" / "ca.crt"

    def start(self, name: str) -> None:
        argv, log = self.argv[name]
        setattr(self, name, Proc(argv, log))

    def stop(self) -> None:
        for proc in (self.address, self.gateway, self.front):
            if proc is not None:
                proc.stop()


@dataclass
class Fleet:
    net: Net
    workdir: Path
    client_key: str
    fleet_key: str
    boxes: list[Box] = field(default_factory=list)
    gateways: list[GatewaySide] = field(default_factory=list)
    https_port: int = 8443
    virtual_address: str | None = None   # with two gateways: the address they share

    @property
    def front(self) -> Proc | None:
        return self.gateways[0].front if self.gateways else None

    @property
    def gateway(self) -> Proc | None:
        return self.gateways[0].gateway if self.gateways else None

    @property
    def state_file(self) -> Path:
        return self.gateways[0].state_file

    @property
    def url(self) -> str:
        return f"https://{self.virtual_address or self.net.address(0)}:{self.https_port}"

    @property
    def certificate(self) -> Path:
        return self.gateways[0].certificate

    def tls(self) -> ssl.SSLContext:
        """Trusting every gateway's local CA: behind a virtual address either may answer."""
        context = ssl.create_default_context(cafile=str(self.gateways[0].certificate))
        for side in self.gateways[1:]:
            context.load_verify_locations(cafile=str(side.certificate))
        return context

    def state(self, side: int = 0) -> dict:
        try:
            return json.loads(self.gateways[side].state_file.read_text())
        except (OSError, ValueError):
            return {}

    def registered(self, side: int = 0) -> set[tuple[str, str]]:
        """(box base URL, model) pairs the router has as workers, from the gateway's state file."""
        return {(r["url"].rsplit("/fleet/", 1)[0], r["model_id"]) for r in self.state(side).get("registered", [])}

    def stop(self) -> None:
        for side in self.gateways:
            side.stop()
        for proc in [*(b.front for b in self.boxes), *(b.proc for b in self.boxes)]:
            if proc is not None:
                proc.stop()
        for box in self.boxes:
            if box.quota is not None:
                box.quota.lift()
        self.net.remove()


def _key_file(path: Path, key: str) -> Path:
    path.write_text(key + "\n")
    path.chmod(0o600)
    return path


def start_fleet(workdir: Path, box_models: list[str | None], *, policy: str = "cache_aware", parallel: int = 4,
                max_queue: int = 64, ctx_size: int = 1024, poll_interval: float = 0.5,
                governor_state: bool = False, behind_front: tuple[int, ...] = (),
                trace_port: int | None = None, cpu_percent: list[float | None] | None = None,
                failover: bool = False, route_by_speed: bool = False) -> Fleet:
    """Boxes in namespaces; box_models[i] is a GGUF path box i serves (None: the built-in model). Box 0 is the
    gateway. Returns once every box is ready and the router has a worker for each box's model. With `trace_port`,
    every box's API sends its spans to an OTLP collector on that port of the root namespace. cpu_percent[i] caps box
    i's processes at that share of one CPU (a cgroup quota, set before its engine and workers start: they inherit
    it); None or a missing entry: no cap. With `failover`, box 1 is a gateway too and both hold the virtual address
    PREFIX.200 by VRRP (box 0 first: the higher priority); returns once one of them holds it."""
    net = Net(len(box_models))
    fleet = None
    gateways = (0, 1) if failover else (0,)
    try:
        client_keys = workdir / "client_keys.json"
        client_key = subprocess.run(everycycle("keys", "create", "--keys", str(client_keys), "client"),
                                    capture_output=True, text=True, check=True).stdout.strip()
        fleet_key = subprocess.run(everycycle("keys", "create", "--keys", str(workdir / "fleet_made.json"), "fleet"),
                                   capture_output=True, text=True, check=True).stdout.strip()
        key_file = _key_file(workdir / "fleet.key", fleet_key)
        fleet = Fleet(net, workdir, client_key, fleet_key,
                      virtual_address=f"{net.prefix}.200" if failover else None)
        for i, model in enumerate(box_models):
            keys = workdir / f"box{i}_keys.json"
            if i in gateways:  # a gateway's own API takes the clients' keys (the front asks it) and the fleet key
                shutil.copy(client_keys, keys)
            # every box keeps the voucher's public key, a gateway the seed that signs them (auth/fleet_vouch.py)
            subprocess.run(everycycle("keys", "import", "--keys", str(keys), "--key-file", str(key_file), "fleet",
                                      *(["--gateway"] if i in gateways else [])), check=True, capture_output=True)
            common = ["--keys", str(keys), "--threads", "1", "--workers", "1", "--ctx-size", str(ctx_size),
                      "--parallel", str(parallel), "--max-queue", str(max_queue),
                      "--model-store", str(workdir / f"box{i}_store"), "--run-dir", str(workdir / f"box{i}_run"),
                      # the box's key ledger, which its engines and API share (vouched keys' use across the fleet)
                      "--usage-dir", str(workdir / f"box{i}_usage")]
            if model:
                common += ["--model", model]
            if trace_port is not None:  # the root namespace's address on the bridge
                common += ["--trace-endpoint", f"http://{net.prefix}.1:{trace_port}"]
            if governor_state:  # a file the test writes to play the governor
                common += ["--governor-state", str(workdir / f"box{i}_governor.json")]
            if i in gateways:
                listen = ["--unix-socket", str(workdir / f"box{i}_api" / "http.sock"), "--also-listen", "127.0.0.1:8081",
                          "--fleet-router", f"127.0.0.1:{FleetSettings().router_port}",   # fleet.toml's default
                          "--fleet-state", str(workdir / f"fleet-state-{i}.json")]  # its controller's (_gateway_side)
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
            percent = (cpu_percent or [])[i] if i < len(cpu_percent or []) else None
            if percent is not None:
                from image.cpu_quota import CpuQuota

                box.quota = CpuQuota(box.proc.popen.pid, percent, f"everycycle-fleet-box{i}-{os.getpid()}")
            if i in behind_front and i not in gateways:
                member_toml = workdir / f"box{i}_front.toml"
                member_toml.write_text(f'listen = "{net.address(i)}"\nhttp = "off"\n'
                                       f'fleet_gateway = "{net.address(0)}"\n')
                box.certificate = workdir / f"box{i}_state" / "tls" / "ca.crt"  # its local CA
                box.front = Proc(net.run_in(i, everycycle(
                    "front", "run", "--settings", str(member_toml), "--state-dir", str(workdir / f"box{i}_state"),
                    "--run-dir", str(workdir / f"box{i}_front"),
                    "--upstream-socket", str(workdir / f"box{i}_api" / "http.sock"))), workdir / f"box{i}_front.log")
        for box in fleet.boxes:
            check = ((lambda b=box: _ready(net, b.index, b.base)) if box.index in gateways
                     else (lambda b=box: _ready_from_root(b)))
            wait_for(check, 120, f"box {box.index} ready", box.proc)
        certificates = [str(b.certificate) for b in fleet.boxes if b.certificate]
        # Each gateway routes to its own API and to every member (another gateway's API is on its loopback).
        peers = ["http://127.0.0.1:8081", *(b.base for b in fleet.boxes if b.index not in gateways)]
        for g in gateways:
            fleet.gateways.append(_gateway_side(fleet, g, policy, key_file, poll_interval, certificates, peers,
                                                route_by_speed))
        for side in fleet.gateways:
            want = {("http://127.0.0.1:8081", m) for m in fleet.boxes[side.index].models} | {
                (b.base, m) for b in fleet.boxes if b.index not in gateways for m in b.models}
            wait_for(lambda s=side.index, want=want: want <= fleet.registered(s), 60, f"gateway {side.index}'s router's workers "
                     f"{sorted(want)}", side.gateway)
            wait_for(lambda s=side: s.certificate.exists(), 30, "the front's certificate", side.front)
        if failover:
            # keepalived once each gateway's front and router answer (its check would fail before), the first
            # gateway's first: with nopreempt, whichever holds the address first keeps it, so the tests know which.
            fleet.gateways[0].start("address")
            wait_for(lambda: vip_holder(fleet) == 0, 30, "the first gateway to hold the virtual address",
                     fleet.gateways[0].address)
            fleet.gateways[1].start("address")
        return fleet
    except BaseException:
        if fleet is not None:
            fleet.stop()
        else:
            net.remove()
        raise


def _gateway_side(fleet: Fleet, i: int, policy: str, key_file: Path, poll_interval: float, certificates: list[str],
                  peers: list[str], route_by_speed: bool = False) -> GatewaySide:
    """Gateway i's front, router and controller, and with a virtual address its keepalived (box 0 the higher
    priority, unicast adverts to the other gateway)."""
    net, workdir = fleet.net, fleet.workdir
    side = GatewaySide(i, workdir / f"gw{i}-state", workdir / f"fleet-state-{i}.json")
    fleet_toml = workdir / f"fleet-{i}.toml"
    text = (f'role = "gateway"\npeers = {json.dumps(peers)}\n'
            f'policy = "{policy}"\nkey_file = "{key_file}"\npoll_interval_s = {poll_interval}\n'
            f'peer_certificates = {json.dumps(certificates)}\nvouch_for_clients = true\n'
            f'route_by_speed = {"true" if route_by_speed else "false"}\n')
    if fleet.virtual_address:
        other = net.address(1 - i)
        text += (f'virtual_address = "{fleet.virtual_address}/24"\nvrrp_priority = {150 if i == 0 else 100}\n'
                 f'vrrp_peers = ["{other}"]\n')
    fleet_toml.write_text(text)
    front_toml = workdir / f"front-{i}.toml"
    listen = "0.0.0.0" if fleet.virtual_address else net.address(i)
    front_toml.write_text(f'listen = "{listen}"\nhttp = "off"\nconnections_per_client = 1024\n'
                          f'requests_per_second_per_client = 1000\nrequest_burst_per_client = 1000\n'
                          + (f'virtual_address = "{fleet.virtual_address}"\n' if fleet.virtual_address else ""))
    side.argv["front"] = (net.run_in(i, everycycle("front", "run", "--settings", str(front_toml),
                                                   "--state-dir", str(side.state_dir),
                                                   "--run-dir", str(workdir / f"gw{i}-front"),
                                                   "--upstream-socket", str(workdir / f"box{i}_api" / "http.sock"),
                                                   "--fleet-settings", str(fleet_toml))), workdir / f"front-{i}.log")
    side.argv["gateway"] = (net.run_in(i, everycycle("fleet", "gateway", "--settings", str(fleet_toml),
                                                     "--state", str(side.state_file))), workdir / f"gateway-{i}.log")
    side.start("front")
    side.start("gateway")
    if fleet.virtual_address:
        side.argv["address"] = (net.run_in(i, everycycle("fleet", "address", "--settings", str(fleet_toml),
                                                         "--front-settings", str(front_toml),
                                                         "--run-dir", str(workdir / f"gw{i}-vrrp"))),
                                workdir / f"address-{i}.log")
    return side


def vip_holder(fleet: Fleet) -> int | None:
    """Which gateway's box holds the virtual address now (None: neither)."""
    for side in fleet.gateways:
        out = subprocess.run(["ip", "-n", fleet.net.names[side.index], "-o", "-4", "addr", "show", "dev", "eth0"],
                             capture_output=True, text=True)
        if f" {fleet.virtual_address}/" in out.stdout:
            return side.index
    return None


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
