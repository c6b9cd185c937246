"""Fleet peers on the LAN by mDNS (DNS-SD, python-zeroconf) (I/O).

A member announces its front (`_everycycle._tcp.local.`: its addresses, HTTPS port, role and version); the
gateway browses and adds what it finds to fleet.toml's peers. Being announced is not being trusted: the router
and the controller reach a found box over HTTPS checked against the fleet's peer certificates (a CA's, for boxes
that join later) with the fleet key, so a box that cannot prove itself never gets work."""

from __future__ import annotations

import ipaddress
import logging
import threading

from zeroconf import IPVersion, ServiceBrowser, ServiceInfo, ServiceStateChange, Zeroconf

log = logging.getLogger("everycycle.fleet")

SERVICE = "_everycycle._tcp.local."


class MDNSError(Exception):
    """mDNS cannot run here; says why."""


def peer_url(address: str, port: int) -> str:
    host = f"[{address}]" if ipaddress.ip_address(address).version == 6 else address
    return f"https://{host}:{port}"


class Announcer:
    """This box's front, announced until stop()."""

    def __init__(self, name: str, addresses: list[str], port: int, properties: dict[str, str]):
        self.info = ServiceInfo(SERVICE, f"{name}.{SERVICE}", port=port, properties=properties,
                                parsed_addresses=addresses, server=f"{name}.local.")
        self._zc: Zeroconf | None = None

    def start(self) -> None:
        try:
            self._zc = Zeroconf(ip_version=IPVersion.V4Only)
            self._zc.register_service(self.info, allow_name_change=True)
        except OSError as exc:
            raise MDNSError(f"cannot announce on the LAN: {exc}") from None
        log.info("announcing %s on the LAN (port %d)", self.info.name, self.info.port)

    def stop(self) -> None:
        if self._zc is not None:
            self._zc.unregister_service(self.info)   # a goodbye, so that the gateway drops us at once
            self._zc.close()
            self._zc = None


class PeerBrowser:
    """The fronts announced on the LAN, as peer URLs (every address a box announces; the controller dedupes
    nothing by name, so that a box with two links is polled on each)."""

    def __init__(self):
        self._zc: Zeroconf | None = None
        self._lock = threading.Lock()
        self._found: dict[str, tuple[str, ...]] = {}   # service name -> its URLs

    def start(self) -> None:
        try:
            self._zc = Zeroconf(ip_version=IPVersion.V4Only)
            self._browser = ServiceBrowser(self._zc, SERVICE, handlers=[self._changed])
        except OSError as exc:
            raise MDNSError(f"cannot browse the LAN: {exc}") from None

    def _changed(self, zeroconf: Zeroconf, service_type: str, name: str, state_change: ServiceStateChange) -> None:
        if state_change is ServiceStateChange.Removed:
            with self._lock:
                gone = self._found.pop(name, None)
            if gone:
                log.info("mDNS: %s left (%s)", name, ", ".join(gone))
            return
        info = zeroconf.get_service_info(service_type, name, timeout=3000)
        if info is None or not info.port:
            return
        urls = tuple(peer_url(a, info.port) for a in info.parsed_addresses())
        with self._lock:
            known = self._found.get(name)
            self._found[name] = urls
        if known != urls:
            log.info("mDNS: found %s at %s", name, ", ".join(urls))

    def peers(self) -> tuple[str, ...]:
        with self._lock:
            return tuple(sorted({u for urls in self._found.values() for u in urls}))

    def stop(self) -> None:
        if self._zc is not None:
            self._zc.close()
            self._zc = None
