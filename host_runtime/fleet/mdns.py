"""Fleet peers on the LAN by mDNS (DNS-SD, python-zeroconf) (I/O).

A member announces its front (`_everycycle._tcp.local.`: its addresses, HTTPS port, role and version); the
gateway browses and adds what it finds to fleet.toml's peers. Being announced is not being trusted: the router
and the controller reach a found box over HTTPS checked against the fleet's peer certificates (a CA's, for boxes
that join later) with the fleet key, so a box that cannot prove itself never gets work."""

from __future__ import annotations

import ipaddress
import logging
import threading
import time

from zeroconf import IPVersion, ServiceBrowser, ServiceInfo, ServiceStateChange, Zeroconf

from host_runtime.common.errors import UnavailableError

log = logging.getLogger("everycycle.fleet")

SERVICE = "_everycycle._tcp.local."
# The most boxes found on the LAN at once: anyone on the LAN can announce.
MAX_FOUND = 64
# A found box whose certificate the fleet's peer_certificates do not vouch for is left out this long: 64 bogus
# announcements no longer fill every place and hide the real boxes (#56, item 9); each is dropped at its first poll.
UNVERIFIED_HOLD_S = 600.0


class MDNSError(UnavailableError):
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
    nothing by name, so that a box with two links is polled on each).

    A goodbye is not trusted either: anyone on the LAN can send one in a box's name. A box that said goodbye
    stays a peer until a poll of it fails (the gateway calls `unanswered`), so a forged goodbye evicts nothing
    that still answers. At most MAX_FOUND boxes are kept."""

    def __init__(self, max_found: int = MAX_FOUND, clock=time.monotonic):
        self._zc: Zeroconf | None = None
        self._lock = threading.Lock()
        self._found: dict[str, tuple[str, ...]] = {}   # service name -> its URLs
        self._left: dict[str, tuple[str, ...]] = {}    # said goodbye, not yet failed a poll
        self._held: dict[str, float] = {}              # failed verification -> until when it is left out
        self.max_found = max_found
        self._clock = clock
        self._full_logged = False

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
                    self._left[name] = gone
            if gone:
                log.info("mDNS: %s said goodbye (%s); it stays until a poll of it fails", name, ", ".join(gone))
            return
        with self._lock:
            if self._held.get(name, 0.0) > self._clock():
                return  # its certificate was not the fleet's: not looked at again for a while
        info = zeroconf.get_service_info(service_type, name, timeout=3000)
        if info is None or not info.port:
            return
        urls = tuple(peer_url(a, info.port) for a in info.parsed_addresses())
        with self._lock:
            self._left.pop(name, None)
            known = self._found.get(name)
            if known is None and len(self._found) + len(self._left) >= self.max_found:
                full, self._full_logged = not self._full_logged, True
                if full:
                    log.warning("mDNS: %d boxes found already; %s and later ones are ignored", self.max_found, name)
                return
            self._found[name] = urls
        if known != urls:
            log.info("mDNS: found %s at %s", name, ", ".join(urls))

    def unanswered(self, url: str) -> None:
        """A poll of `url` failed: a box that said goodbye at that address is gone now."""
        with self._lock:
            for name, urls in list(self._left.items()):
                if url.rstrip("/") in (u.rstrip("/") for u in urls):
                    del self._left[name]
                    log.info("mDNS: %s left (%s)", name, ", ".join(urls))

    def unverified(self, url: str) -> None:
        """A poll of `url` found a certificate the fleet's peer_certificates do not vouch for: the box announcing
        it is left out for UNVERIFIED_HOLD_S, its place free for another."""
        with self._lock:
            for table in (self._found, self._left):
                for name, urls in list(table.items()):
                    if url.rstrip("/") in (u.rstrip("/") for u in urls):
                        del table[name]
                        self._held[name] = self._clock() + UNVERIFIED_HOLD_S
                        log.warning("mDNS: %s (%s) is not one of the fleet's boxes (its certificate is not among "
                                    "peer_certificates): left out for %.0f s", name, url, UNVERIFIED_HOLD_S)
            now = self._clock()
            self._held = {n: t for n, t in self._held.items() if t > now}

    def peers(self) -> tuple[str, ...]:
        with self._lock:
            return tuple(sorted({u for urls in (*self._found.values(), *self._left.values()) for u in urls}))

    def stop(self) -> None:
        if self._zc is not None:
            self._zc.close()
            self._zc = None
