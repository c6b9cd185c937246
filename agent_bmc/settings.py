"""The BMC agent's settings (bmc.toml): written by provisioning from box.toml's [bmc], read by
`everycycle bmc --settings`. --config (JSON, for fan policies) and command-line options win over it."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from host_runtime.common.settings_file import SettingsError

HOSTNAME = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$")
PASSWORD_FILE = "/etc/everycycle/bmc.password"


@dataclass(frozen=True)
class BmcSettings:
    backend: str = "local"      # local: hwmon (no BMC); ipmi: a BMC over LAN
    host: str = ""
    port: int = 623
    user: str = ""
    password_file: str = ""

    def __post_init__(self) -> None:
        if self.backend not in ("local", "ipmi"):
            raise SettingsError("backend", f"must be local or ipmi, got {self.backend!r}")
        if self.host:
            try:
                ipaddress.ip_address(self.host)
            except ValueError:
                if not HOSTNAME.match(self.host):
                    raise SettingsError("host", f"{self.host!r} is not an IP address or host name") from None
        if not 1 <= self.port <= 65535:
            raise SettingsError("port", f"{self.port} is not a UDP port")
        if any(ord(c) < 32 or ord(c) == 127 for c in self.user) or len(self.user) > 16:
            raise SettingsError("user", "an IPMI user name is at most 16 printable characters")
        if self.backend == "ipmi":
            for name in ("host", "user", "password_file"):
                if not getattr(self, name):
                    raise SettingsError(name, "is required with backend ipmi")

    def as_config(self) -> dict:
        """In the form the agent's option parser merges (agent_bmc.cli)."""
        return {k: v for k, v in (("backend", self.backend), ("host", self.host), ("port", self.port),
                                  ("user", self.user), ("password_file", self.password_file)) if v}


def from_box(box: dict) -> BmcSettings:
    bmc = box.get("bmc", {})
    try:
        if bmc.get("mode") != "ipmi":
            return BmcSettings()
        return BmcSettings(backend="ipmi", host=bmc.get("address", ""), user=bmc.get("user", ""),
                           password_file=PASSWORD_FILE)
    except SettingsError as exc:
        box_field = {"host": "bmc.address", "user": "bmc.user", "password_file": "bmc.password_file"}.get(
            exc.field, f"bmc.{exc.field}")
        raise SettingsError(box_field, exc.message) from None
