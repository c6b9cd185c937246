"""The box's name on the LAN (I/O): NAME.local by mDNS (python-zeroconf), with its API announced as an
`_https._tcp` service, so clients reach it by name whatever address DHCP gives it. The addresses are read again
every few seconds and the announcement follows them; the front's certificate names NAME.local too."""

from __future__ import annotations

import ipaddress
import logging
import threading

from zeroconf import IPVersion, ServiceInfo, Zeroconf

from host_runtime.common.errors import UnavailableError
from host_runtime.front.tls import addresses_now

log = logging.getLogger("everycycle.front")

SERVICE = "_https._tcp.local."
REFRESH_S = 10.0


class LanNameError(UnavailableError):
    """mDNS cannot run here; says why."""


def lan_addresses(listen: str) -> list[str]:
    """The IPv4 addresses to announce: the front's own when it listens on one, else the box's non-loopback ones."""
    if listen not in ("0.0.0.0", "::"):
        return [listen] if ipaddress.ip_address(listen).version == 4 else []

    return sorted(str(a) for a in addresses_now() if a.version == 4 and not a.is_loopback and not a.is_link_local)


class LanName:
    """NAME.local and the API's service, announced until stop(); the addresses followed as they change."""

    def __init__(self, name: str, port: int, addresses=lambda: []):
        self.name = name
        self.port = port
        self._addresses = addresses
        self._zc: Zeroconf | None = None
        self._info: ServiceInfo | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _service(self, addresses: list[str]) -> ServiceInfo:
        return ServiceInfo(SERVICE, f"{self.name}.{SERVICE}", port=self.port, properties={"path": "/v1"},
                           parsed_addresses=addresses, server=f"{self.name}.local.")

    def start(self) -> None:
        try:
            self._zc = Zeroconf(ip_version=IPVersion.V4Only)
        except Exception as exc:  # no multicast interface, a socket refused: the box works on, unnamed
            raise LanNameError(f"cannot announce {self.name}.local on the LAN: {exc}") from None
        self._follow()
        self._thread = threading.Thread(target=self._loop, name="lan-name", daemon=True)
        self._thread.start()

    def _follow(self) -> None:
        addresses = self._addresses()
        current = sorted(self._info.parsed_addresses()) if self._info else None
        if addresses == current:
            return
        try:
            if self._info is not None and not addresses:
                self._zc.unregister_service(self._info)
                self._info = None
            elif self._info is None and addresses:
                self._info = self._service(addresses)
                self._zc.register_service(self._info, allow_name_change=True)
            elif addresses:
                self._info = self._service(addresses)
                self._zc.update_service(self._info)
        except Exception as exc:  # zeroconf's own errors (a name taken, the socket gone): said, tried again later
            log.warning("announcing %s.local: %s", self.name, exc)
            return
        log.info("announcing %s.local on the LAN: %s", self.name, ", ".join(addresses) or "no address")

    def _loop(self) -> None:
        while not self._stop.wait(REFRESH_S):
            self._follow()

    def stop(self) -> None:
        self._stop.set()
        if self._zc is not None:
            if self._info is not None:
                self._zc.unregister_service(self._info)
            self._zc.close()
            self._zc = None
