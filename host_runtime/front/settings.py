"""The front's settings: one typed structure, written by provisioning (and `make run`), read by the front's
runner and by the serving API (which enforces the /metrics access it names). Both sides import this module."""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from pydantic import Field

from host_runtime.common import settings_file
from host_runtime.common.setting_rules import SettingsError, check_fields, one_of

HTTP_MODES = ("redirect", "off", "serve", "serve-lan")
BOX_HTTP_MODES = ("redirect", "off", "serve-lan")  # "serve" is `make run`'s, on loopback: never a box's
METRICS_ACCESS = ("open", "key", "loopback")
# The rules box.toml's [api] shares (provisioning/box_model.py)
Port = Annotated[int, Field(ge=1, le=65535)]
MetricsAccess = Annotated[one_of(METRICS_ACCESS), Field(description="who may read /metrics: open, key (default), "
                                                                    "or loopback")]




@dataclass(frozen=True)
class FrontSettings:
    listen: str = "0.0.0.0"          # the address LAN clients reach
    https_port: Port = 8443
    http_port: Port = 8080
    # Plain HTTP: "redirect" to HTTPS (only /health answers there), "off", "serve" (a loopback address only:
    # `make run` on a developer's machine), or "serve-lan": the owner's explicit choice of the whole API in clear
    # on the LAN (keys and prompts readable on the network) for clients that cannot use TLS at all.
    http: one_of(HTTP_MODES) = "redirect"
    metrics: MetricsAccess = "key"             # /metrics: "open", "key" (an API key), or "loopback" (this machine only)
    certificate: str = ""            # PEM paths from the bundle; empty: one issued by the box's local CA
    private_key: str = ""
    # Slow-client limits (nginx). Idle and slow-header connections cost nginx a few hundred bytes each, never a
    # gunicorn thread: these close them, and cap what one client address can hold or ask.
    header_timeout_s: int = 10
    body_timeout_s: int = 30
    connections_per_client: int = 64
    requests_per_second_per_client: int = 20
    request_burst_per_client: int = 100
    max_body_bytes: int = 1 << 20
    max_media_body_bytes: int = 32 << 20  # a generation's body with images (#58); the API keeps the rest to the above
    # On a fleet's member: the gateway's address (two, comma-separated, where two gateways share a virtual
    # address). Every client of the fleet reaches this box through them, so they are not held to the per-client
    # limits (the gateway's own front holds each client to them).
    fleet_gateway: str = ""
    # NAME.local by mDNS, with the API announced as an _https._tcp service (front/lan_name.py): clients reach the
    # box by name whatever address DHCP gives it. The fleet program, which runs on every box, announces it.
    lan_name: Annotated[bool, Field()] = True
    # On one of a fleet's two gateways: the address they share (fleet.toml's virtual_address, without its prefix
    # length). The certificate names it; the front listens on every address (listen 0.0.0.0) to answer there.
    virtual_address: str = ""

    def __post_init__(self) -> None:
        check(self)

    @property
    def loopback_only(self) -> bool:
        try:
            return ipaddress.ip_address(self.listen).is_loopback
        except ValueError:
            return False


def short_hostname(hostname: str | None = None) -> str:
    """The box's name on the LAN: its host name's first label (NAME in NAME.local, as mDNS announces it and the
    front's certificate names it)."""
    return (hostname or socket.gethostname()).split(".")[0]


def check(s: FrontSettings) -> None:
    check_fields(s)
    try:
        ipaddress.ip_address(s.listen)
    except ValueError:
        raise SettingsError("listen", f"{s.listen!r} is not an IP address") from None
    if s.https_port == s.http_port:
        raise SettingsError("http_port", "must differ from https_port")
    if s.http == "serve" and not s.loopback_only:
        raise SettingsError("http", "'serve' (keys in clear text) is allowed only on a loopback address; "
                                 "use 'redirect' or 'off' on the LAN, or 'serve-lan' to choose clear text there")
    for address in gateway_addresses(s):
        try:
            ipaddress.ip_address(address)
        except ValueError:
            raise SettingsError("fleet_gateway", f"{address!r} is not an IP address") from None
    if s.virtual_address:
        try:
            ipaddress.IPv4Address(s.virtual_address)
        except ValueError:
            raise SettingsError("virtual_address", f"{s.virtual_address!r} is not an IPv4 address") from None
        if not ipaddress.ip_address(s.listen).is_unspecified:
            raise SettingsError("listen", f"a gateway holding a virtual address listens on every address "
                                          f"(0.0.0.0), not only {s.listen}")
    if bool(s.certificate) != bool(s.private_key):
        raise SettingsError("certificate", "a certificate and its private_key come together")
    for name in ("header_timeout_s", "body_timeout_s", "connections_per_client", "requests_per_second_per_client",
                 "request_burst_per_client", "max_body_bytes", "max_media_body_bytes"):
        if getattr(s, name) < 1:
            raise SettingsError(name, "must be at least 1")


BOX_TLS_CERTIFICATE = "/etc/everycycle/tls/api.crt"  # where provisioning puts a bundle's certificate and key
BOX_TLS_KEY = "/etc/everycycle/tls/api.key"


def from_box(box: dict) -> FrontSettings:
    """box.toml's [api] section as the front's settings: the one translation, used by provisioning (to write
    front.toml) and by bundle validation (so a bad combination is refused naming the box.toml field)."""
    api = box.get("api", {})
    fleet = box.get("fleet", {})
    gateways = box_gateway_addresses(fleet) if fleet.get("role") == "member" else []
    try:
        return FrontSettings(https_port=api.get("port", FrontSettings.https_port),
                             http_port=api.get("http_port", FrontSettings.http_port),
                             http=api.get("http", FrontSettings.http), metrics=api.get("metrics", FrontSettings.metrics),
                             certificate=BOX_TLS_CERTIFICATE if api.get("tls_certificate") else "",
                             private_key=BOX_TLS_KEY if api.get("tls_key") else "",
                             fleet_gateway=",".join(gateways),
                             lan_name=api.get("lan_name", FrontSettings.lan_name),
                             virtual_address=_virtual_ip(fleet))
    except SettingsError as exc:
        box_field = {"https_port": "api.port", "http_port": "api.http_port", "http": "api.http",
                     "metrics": "api.metrics", "certificate": "api.tls_certificate",
                     "fleet_gateway": "fleet.gateway_address",
                     "virtual_address": "fleet.virtual_address"}.get(exc.field, f"api.{exc.field}")
        raise SettingsError(box_field, exc.message) from None


def gateway_addresses(s: FrontSettings) -> list[str]:
    return [a.strip() for a in s.fleet_gateway.split(",")] if s.fleet_gateway else []


def box_gateway_addresses(fleet: dict) -> list[str]:
    """box.toml's fleet.gateway_address: one address, or a list of them (two gateways)."""
    given = fleet.get("gateway_address") or []
    given = [given] if isinstance(given, str) else given
    if not isinstance(given, list) or not all(isinstance(a, str) for a in given):
        raise SettingsError("fleet.gateway_address", "must be an IP address or a list of them")
    return given


def _virtual_ip(fleet: dict) -> str:
    """box.toml's fleet.virtual_address without its prefix length, on a gateway (fleet/settings.py checks it)."""
    vip = fleet.get("virtual_address") if fleet.get("role") == "gateway" else None
    return vip.split("/")[0] if isinstance(vip, str) and vip else ""


def from_mapping(doc: dict) -> FrontSettings:
    return settings_file.from_mapping(FrontSettings, doc)


def load(path: str | Path | None) -> FrontSettings:
    """The settings in `path`; the defaults where there is no file."""
    return settings_file.load(FrontSettings, path)


def dump(settings: FrontSettings) -> bytes:
    return settings_file.dump(settings)


def save(settings: FrontSettings, path: str | Path) -> None:
    settings_file.save(settings, path)


def serves_plain_http(s: FrontSettings) -> bool:
    """Whether plain HTTP carries the whole API (not only /health and redirects)."""
    return s.http in ("serve", "serve-lan")
