"""The box holding a model reaches the members that lend it devices (`serve --shard-host ADDR:PORT`).

One stunnel client for all of them (a loopback port per member, TLS with the fleet's key to each), each member
asked its RPC protocol first (probe.py), then registered with ggml: its devices (RPC0, RPC1, ...) are then
devices the planner places layers on and llama.cpp's dry run proves, like the holder's own GPUs.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from host_runtime.gpu import rpc_devices
from host_runtime.gpu.bandwidth import bandwidth_gbps
from host_runtime.gpu.llama_devices import RemoteView
from host_runtime.shard.errors import ShardError
from host_runtime.shard.facts import Link
from host_runtime.shard.facts import ask as ask_facts
from host_runtime.shard.ports import free_loopback_port
from host_runtime.shard.probe import hello
from host_runtime.shard.tunnel import Tunnel
from host_runtime.shard.tunnel_conf import FACTS_NAME, Route, client_conf
from host_runtime.shard.wire_key import holder_secrets

log = logging.getLogger("everycycle.shard")


@dataclass(frozen=True)
class ShardConfig:
    hosts: tuple[str, ...] = ()    # the members' HOST:PORT (their `shard host --listen`), in device order
    # the fleet key's file, or the members' own wire keys (wire_key.holder_secrets): the wire's TLS is keyed so
    key_file: str | None = None


def read_secrets(path: str, members: list[str]) -> str:
    """stunnel's secrets for `members` from the holder's key file; ShardError saying what is wrong."""
    try:
        with open(path) as handle:
            return holder_secrets(handle.read(), members)
    except OSError as exc:
        raise ShardError(f"cannot read the shard key file {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise ShardError(f"the shard key file {path} {exc}") from None


class Shards:
    """The members attached to this process, for as long as it lives: `devices` maps each ggml device name
    (RPC0, ...) to the member lending it, `links` each member to its link's measured speed. The tunnel and its
    loopback ports are made once: ggml keeps a device per endpoint for the process's life, so a retry must name
    the same endpoints."""

    def __init__(self, config: ShardConfig, say=lambda phase: None):
        if not config.key_file:
            raise ShardError("shard hosts need a key file (--shard-key-file): their wire is keyed from it")
        secrets = read_secrets(config.key_file, list(config.hosts))
        self.say = say
        # each member: (its RPC wire's loopback port, its facts' loopback port)
        self.members = {host: (free_loopback_port(), free_loopback_port()) for host in config.hosts}
        routes = [route for i, (host, (rpc, facts)) in enumerate(self.members.items())
                  for route in (Route(f"member{i}", f"127.0.0.1:{rpc}", host),
                                Route(f"member{i}-facts", f"127.0.0.1:{facts}", host, sni=FACTS_NAME))]
        say("starting the tunnel to the shard hosts")
        ports = [port for pair in self.members.values() for port in pair]
        self.tunnel = Tunnel(lambda secrets, log_file: client_conf(routes, secrets, log_file),
                             secrets, ports)
        self.devices: dict[str, str] = {}
        self.links: dict[str, Link] = {}

    def attach(self) -> None:
        """Ask every member first (its protocol, what it lends, the link), then register them all: a member
        that cannot be used leaves ggml's registry as it was (ShardError naming it, with what the tunnel saw)."""
        asked = {}
        for host, (rpc, facts) in self.members.items():
            self.say(f"asking shard host {host}")
            try:
                version = hello("127.0.0.1", rpc, member=host)
                asked[host] = (version, *ask_facts("127.0.0.1", facts, member=host))
            except ShardError as exc:
                seen = self.tunnel.log_tail(1)
                raise ShardError(f"{exc} (the tunnel: {seen})" if seen else str(exc)) from None
        for host, (version, lent, link) in asked.items():
            views = [RemoteView(f"{host} {d.name}", d.type, d.lend_bytes, d.total_bytes,
                                bandwidth_gbps(d.description, d.type)) for d in lent]
            try:
                names = rpc_devices.add_server(f"127.0.0.1:{self.members[host][0]}", views)
            except rpc_devices.RpcBackendError as exc:
                raise ShardError(f"shard host {host}: {exc}") from None
            log.info("shard host %s (RPC protocol %d.%d.%d; %s) lends %s", host, *version, link,
                     ", ".join(f"{d.name} as {n} ({d.lend_bytes / 2**20:,.0f} MiB)" for d, n in zip(lent, names)))
            self.devices.update({name: host for name in names})
            self.links[host] = link

    def describe(self) -> list[dict]:
        """Each member, its devices here and its link as measured when this process joined (the engine's info,
        the capability map, `fleet status`)."""
        return [{"host": host, "devices": sorted(n for n, h in self.devices.items() if h == host),
                 "round_trip_ms": link.round_trip_ms, "mbytes_per_s": link.mbytes_per_s}
                for host, link in self.links.items()]

    def stop(self) -> None:
        self.tunnel.stop()
