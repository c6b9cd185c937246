"""The fleet gateway's settings (fleet.toml): one typed structure, written by provisioning from box.toml's
[fleet] and read by `everycycle fleet gateway`. The fleet key itself lives in its own 0600 file."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated
from urllib.parse import urlsplit

from pydantic import Field

from host_runtime.auth.keystore import KeyStoreError, check_permissions
from host_runtime.common import settings_file
from host_runtime.common.service_user import FLEET_USER
from host_runtime.common.host_port import split_host_port
from host_runtime.common.setting_rules import SettingsError, check_fields, one_of
from host_runtime.shard.wire_key import check_member_address

ROLES = ("none", "member", "gateway")
# On the box (provisioning writes these from box.toml's [fleet]):
BOX_KEY_FILE = "/etc/everycycle/fleet.key"
BOX_PEER_CERT_DIR = "/etc/everycycle/fleet-peers"
# A shard host's own wire key (the shard user's) and a holder's keys to its shard hosts (the serving user's):
# each derived from the fleet key by provisioning, which a box keeps only on the gateway.
BOX_SHARD_WIRE_KEY = "/etc/everycycle/shard-wire.key"
BOX_SHARD_HOLDER_KEYS = "/etc/everycycle/shard-holder.keys"


def box_peer_certificate(i: int) -> str:
    """Where provisioning puts box.toml's fleet.peer_certificates[i]."""
    return f"{BOX_PEER_CERT_DIR}/peer-{i}.pem"


# The gateway's router speaks TCP only and the box's API listens on a Unix socket: on the gateway the API also
# listens here (serving.toml fleet_listen), loopback only, and the router reaches its own box's models there.
OWN_API = "127.0.0.1:8081"
POLICIES = ("cache_aware", "round_robin", "power_of_two", "random")
# The rules box.toml's [fleet] shares (provisioning/box_model.py)
Role = Annotated[one_of(ROLES), Field(description="none (default): a box on its own; member: a box the fleet's "
                                                  "gateway routes to; gateway: runs the gateway (and serves too)")]
Policy = Annotated[one_of(POLICIES), Field(description="gateway: the router's policy (default cache_aware)")]
VrrpPriority = Annotated[int, Field(ge=1, le=254, description="gateway with virtual_address: the higher of the two "
                                                              "holds the address first (default 100)")]
VrrpRouterId = Annotated[int, Field(ge=1, le=255, description="gateway with virtual_address: the same on both "
                                                              "gateways, unique on the LAN (default 51)")]
RouteBySpeed = Annotated[bool, Field(description="gateway: a box much slower than the fastest holding a model gets "
                                                 "that model's requests only while the faster ones are full "
                                                 "(default true; false: the router's policy alone)")]
ShardListen = Annotated[str, Field(description="member or gateway: lend this box's devices (its GPUs, else its CPU) "
                                               "to a model another box holds, on this ADDR:PORT of the LAN "
                                               "(like 10.0.0.3:50052); TLS keyed from the fleet key, nothing "
                                               "else gets in (default: lends nothing)")]
ShardLendMib = Annotated[int, Field(ge=1, description="with shard_listen: the most any device lends, MiB (default: "
                                                      "a GPU its free memory, the CPU the RAM available, less a "
                                                      "margin)")]
ShardHosts = Annotated[list[str], Field(description="member or gateway: the boxes whose shard_listen lend this "
                                                    "box's models their devices, in order (each ADDR:PORT)")]
Mdns = Annotated[bool, Field(description="member: announce this box's front on the LAN; gateway: add the fronts "
                                         "announced there to peers (they must still pass peer_certificates)")]


@dataclass(frozen=True)
class FleetSettings:
    role: Role = "none"
    peers: tuple[str, ...] = ()      # every box's API base URL, the gateway's own included
    policy: Policy = "cache_aware"      # the router's: prefix-aware by default; round_robin for comparisons
    router_port: int = 8090          # the router listens on loopback only; the front is the clients' door
    metrics_port: int = 8091         # the router's Prometheus exporter, loopback
    poll_interval_s: float = 1.0     # how often each box's capability map is read
    # A box much slower than the fastest warm with a model gets that model's requests only while the faster ones
    # are full (fleet/controller.py Speeds). On by default since its speed is the prompt rate (engine/metrics.py):
    # over three repeats of bench/fleet.py --fleet hetero, 1.08x (0.98-1.20) the tokens/s of the router's
    # cache_aware alone and a tighter spread (5.55-5.74 tok/s against 4.61-5.71: cache_aware once split the common
    # model 16/16 over a 0.3-CPU box and a full one), TTFT p50 0.83x, p95 1.22x (0.90-1.50)
    # (bench/results-2026-12-07-fleet-hetero-prefill-speed-2core.json); on equal boxes 0.97x (0.93-1.02x), two
    # repeats (bench/results-2026-12-07-fleet-equal-prefill-speed-2core.json)
    route_by_speed: RouteBySpeed = True
    key_file: str = BOX_KEY_FILE     # the fleet key: the gateway's credential at every box (0600)
    # PEM certificates the router trusts for https:// peers (their fronts' self-signed certificates, or a CA's)
    peer_certificates: tuple[str, ...] = ()
    # mDNS on the LAN (host_runtime/fleet/mdns.py): a member announces its front, the gateway adds the fronts it
    # finds to `peers` (trusted only as far as peer_certificates vouch for them)
    mdns: Mdns = False
    # Two gateways, one address for clients (fleet/vrrp.py: keepalived's VRRP moves it to the standby when the
    # active gateway stops): the address with its prefix length, like 192.168.1.50/24; empty: no failover.
    virtual_address: str = ""
    vrrp_priority: VrrpPriority = 100         # the higher holds the address first; the other is the standby
    vrrp_router_id: VrrpRouterId = 51         # the same on both gateways, unique on the LAN segment
    vrrp_peers: tuple[str, ...] = ()  # the other gateway's address (unicast adverts); empty: VRRP's multicast
    vrrp_interface: str = ""         # empty: the interface whose network holds virtual_address
    # The gateway's API vouches for clients' keys (its key file holds the fleet key's signing seed: provisioning
    # or `keys import --gateway`): boxes that check vouchers are registered without the fleet key, so the router
    # passes the voucher and a key's limits hold where it is served (auth/fleet_vouch.py). Off: every box gets
    # the fleet key, as before vouchers (a gateway provisioned before them).
    vouch_for_clients: bool = False
    # A shard host (`everycycle fleet shard-host --if-lending`): where it lends its devices, how much, and its own
    # wire key (0600, the shard user's). Empty: the program waits, lending nothing.
    shard_listen: str = ""
    shard_lend_mib: int = 0
    shard_wire_key_file: str = BOX_SHARD_WIRE_KEY

    def __post_init__(self) -> None:
        object.__setattr__(self, "peers", tuple(self.peers))
        object.__setattr__(self, "peer_certificates", tuple(self.peer_certificates))
        object.__setattr__(self, "vrrp_peers", tuple(self.vrrp_peers))
        check_fields(self)
        check_failover(self)
        for name in ("router_port", "metrics_port"):
            if not 1 <= getattr(self, name) <= 65535:
                raise SettingsError(name, f"{getattr(self, name)} is not a TCP port")
        if self.router_port == self.metrics_port:
            raise SettingsError("metrics_port", "must differ from router_port")
        if not 0.1 <= self.poll_interval_s <= 60:
            raise SettingsError("poll_interval_s", "must be between 0.1 and 60 seconds")
        for i, peer in enumerate(self.peers):
            check_peer(f"peers[{i}]", peer)
        if len(set(p.rstrip("/") for p in self.peers)) != len(self.peers):
            raise SettingsError("peers", "lists a box twice")
        if self.role == "gateway" and not self.peers:
            raise SettingsError("peers", "a gateway needs at least one box (its own API included)")
        for i, cert in enumerate(self.peer_certificates):
            if not isinstance(cert, str) or not cert.startswith("/"):
                raise SettingsError(f"peer_certificates[{i}]", f"must be an absolute path, got {cert!r}")
        check_shard_host(self)


def check_shard_host(s: FleetSettings) -> None:
    if not s.shard_listen:
        if s.shard_lend_mib:
            raise SettingsError("shard_lend_mib", "is only used with shard_listen")
        return
    if s.role == "none":
        raise SettingsError("shard_listen", "is only used in a fleet (role \"member\" or \"gateway\"): the wire is "
                                            "keyed from the fleet key")
    try:
        check_member_address(s.shard_listen)
    except (ValueError, AttributeError) as exc:
        raise SettingsError("shard_listen", f"must be this box's ADDR:PORT on the LAN, like 10.0.0.3:50052 "
                                            f"({exc})") from None
    if isinstance(s.shard_lend_mib, bool) or not isinstance(s.shard_lend_mib, int) or s.shard_lend_mib < 0:
        raise SettingsError("shard_lend_mib", f"must be a whole number of MiB, got {s.shard_lend_mib!r}")
    if not s.shard_wire_key_file.startswith("/"):
        raise SettingsError("shard_wire_key_file", f"must be an absolute path, got {s.shard_wire_key_file!r}")


def check_failover(s: FleetSettings) -> None:
    """The VRRP settings: only on a gateway, an address with its network, sane numbers."""
    if not s.virtual_address:
        for name in ("vrrp_peers", "vrrp_interface"):
            if getattr(s, name):
                raise SettingsError(name, "is only used with virtual_address")
        return
    if s.role != "gateway":
        raise SettingsError("virtual_address", "is only used on a gateway (role = \"gateway\")")
    if not isinstance(s.virtual_address, str) or "/" not in s.virtual_address:
        raise SettingsError("virtual_address", f"must be an address with its prefix length, like 192.168.1.50/24, "
                                               f"got {s.virtual_address!r}")
    try:
        iface = ipaddress.ip_interface(s.virtual_address)
    except ValueError:
        raise SettingsError("virtual_address", f"{s.virtual_address!r} is not an address with its prefix "
                                               "length") from None
    if iface.version != 4:
        raise SettingsError("virtual_address", "must be an IPv4 address (VRRP version 2)")
    if iface.ip in (iface.network.network_address, iface.network.broadcast_address) and iface.network.prefixlen < 31:
        raise SettingsError("virtual_address", f"{iface.ip} is its network's own or broadcast address")
    for i, peer in enumerate(s.vrrp_peers):
        try:
            ipaddress.IPv4Address(peer)
        except (ValueError, TypeError):
            raise SettingsError(f"vrrp_peers[{i}]", f"must be the other gateway's IPv4 address, got {peer!r}") from None
    if s.vrrp_interface and (not isinstance(s.vrrp_interface, str) or "/" in s.vrrp_interface
                             or len(s.vrrp_interface) > 15):
        raise SettingsError("vrrp_interface", f"{s.vrrp_interface!r} is not an interface name")


def process_environment(settings: FleetSettings) -> bytes:
    """fleet-address.env, which systemd reads: the user supervisord's fleet-address program runs as. Root only where
    this gateway holds a virtual address (keepalived adds it and sends VRRP and ARP); the fleet's user elsewhere,
    where the program only waits. Fixed text, never a value from a bundle (as the governor's governor.env)."""
    user = "root" if settings.virtual_address else FLEET_USER
    return f"EVERYCYCLE_FLEET_ADDRESS_USER={user}\n".encode()


def check_peer(field: str, peer) -> None:
    if not isinstance(peer, str):
        raise SettingsError(field, "must be a URL string")
    parts = urlsplit(peer)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/"):
        raise SettingsError(field, f"must be a box's base URL like http://10.0.0.2:8080, got {peer!r}")


FAILOVER_FIELDS = ("virtual_address", "vrrp_priority", "vrrp_router_id", "vrrp_peers", "vrrp_interface")


def from_box(box: dict) -> FleetSettings:
    """box.toml's [fleet] as the gateway's settings: the one translation, used by provisioning (to write
    fleet.toml) and by bundle validation (so a bad value is refused naming the box.toml field). A member's
    settings only say so: what a member needs is elsewhere (the fleet key's hash in api_keys.json, the gateway's
    address in front.toml)."""
    fleet = box.get("fleet", {})
    role = fleet.get("role", "none")
    if role != "none" and not fleet.get("key_file"):
        raise SettingsError("fleet.key_file", f"is required with role {role!r}: every box of a fleet holds the fleet key")
    if role != "gateway":
        for name in ("peers", "peer_certificates", "policy", *FAILOVER_FIELDS):
            if name in fleet:
                raise SettingsError(f"fleet.{name}", "is only used on the gateway (role = \"gateway\")")
    if role == "none" and "mdns" in fleet:
        raise SettingsError("fleet.mdns", "is only used in a fleet (role \"member\" or \"gateway\")")
    if role != "member" and "gateway_address" in fleet:
        raise SettingsError("fleet.gateway_address", "is only used on a member (role = \"member\")")
    if role == "none":
        for name in ("shard_listen", "shard_lend_mib", "shard_hosts"):
            if name in fleet:
                raise SettingsError(f"fleet.{name}", "is only used in a fleet (role \"member\" or \"gateway\"): "
                                                     "the wire is keyed from the fleet key")
    certs = tuple(box_peer_certificate(i) for i in range(len(fleet.get("peer_certificates", []))))
    own = (f"http://{OWN_API}",) if role == "gateway" else ()
    mine = {iface["address"].split("/")[0] for iface in box.get("network", {}).get("interfaces", [])
            if iface.get("mode") == "static" and iface.get("address")}
    listen = fleet.get("shard_listen", "")
    try:
        listen_host = str(split_host_port(listen)[0]) if listen else ""
    except (ValueError, AttributeError):
        listen_host = ""  # FleetSettings below refuses it, naming the field
    if listen_host and mine and listen_host not in mine:
        raise SettingsError("fleet.shard_listen", f"{listen} is not an address of this box ({', '.join(sorted(mine))})")
    if listen in fleet.get("shard_hosts", []):
        raise SettingsError("fleet.shard_hosts", f"names this box's own shard_listen {listen}")
    for i, peer in enumerate(fleet.get("peers", [])):  # named by box.toml's index (fleet.toml's adds its own)
        check_peer(f"fleet.peers[{i}]", peer)
        if urlsplit(peer).scheme != "https":
            # The router sends the fleet key to every peer: in clear over the LAN it is anyone's.
            raise SettingsError(f"fleet.peers[{i}]", f"must be https:// (the fleet key goes to it), got {peer!r}")
        if urlsplit(peer).hostname in mine:
            raise SettingsError(f"fleet.peers[{i}]", f"{peer} is this box: the gateway adds its own API itself")
    try:
        return FleetSettings(role=role, peers=own + tuple(fleet.get("peers", ())),
                             policy=fleet.get("policy", FleetSettings.policy), peer_certificates=certs,
                             mdns=fleet.get("mdns", False),
                             route_by_speed=fleet.get("route_by_speed", FleetSettings.route_by_speed),
                             shard_listen=listen, shard_lend_mib=fleet.get("shard_lend_mib", 0),
                             **{name: fleet[name] for name in FAILOVER_FIELDS if name in fleet})
    except SettingsError as exc:
        raise SettingsError(f"fleet.{exc.field}", exc.message) from None


def load(path: str | Path | None) -> FleetSettings:
    return settings_file.load(FleetSettings, path)


def save(settings: FleetSettings, path: str | Path) -> None:
    settings_file.save(settings, path)


def read_key(path: str | Path) -> str:
    """The fleet key from its file; SettingsError naming key_file when it is missing, empty or readable by others."""
    p = Path(path)
    try:
        check_permissions(p)  # the rule the API's key file has
        text = p.read_text().strip()
    except OSError as exc:
        raise SettingsError("key_file", f"cannot read {p}: {exc.strerror}") from None
    except KeyStoreError as exc:
        raise SettingsError("key_file", str(exc).replace("key file ", "", 1)) from None
    problem = key_text_problem(text)
    if problem:
        raise SettingsError("key_file", f"{p} {problem}")
    return text


MIN_KEY_CHARS = 20


def key_text_problem(text: str) -> str | None:
    """What is wrong with a fleet key file's (stripped) text, or None: the one rule for the bundle's file and the
    box's copy."""
    if len(text) < MIN_KEY_CHARS or any(c.isspace() for c in text):
        return f"must hold one key of at least {MIN_KEY_CHARS} characters (from 'everycycle keys create')"
    return None
