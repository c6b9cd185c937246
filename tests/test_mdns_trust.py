"""Boxes found by mDNS are trusted only as far as the fleet's certificates vouch for them (#56, item 9): a gateway
without peer_certificates polled any announcement with the fleet key, and 64 bogus announcements hid the real
boxes. Pure: the browser's bookkeeping with a stand-in for zeroconf and a clock."""

from __future__ import annotations

from types import SimpleNamespace

from zeroconf import ServiceStateChange

from host_runtime.fleet.gateway import Gateway
from host_runtime.fleet.mdns import UNVERIFIED_HOLD_S, PeerBrowser
from host_runtime.fleet.peers import unverified_certificate
from host_runtime.fleet.settings import FleetSettings

SERVICE = "_https._tcp.local."


class LAN:
    """zeroconf's get_service_info, answered from a table of announcements."""

    def __init__(self):
        self.boxes: dict[str, str] = {}

    def get_service_info(self, service_type, name, timeout=0):
        address = self.boxes.get(name)
        return SimpleNamespace(port=8443, parsed_addresses=lambda: [address]) if address else None


def announce(browser: PeerBrowser, lan: LAN, name: str, address: str) -> None:
    lan.boxes[name] = address
    browser._changed(lan, SERVICE, name, ServiceStateChange.Added)


def test_a_flood_of_bogus_announcements_no_longer_hides_the_real_boxes():
    now = [0.0]
    lan, browser = LAN(), PeerBrowser(max_found=4, clock=lambda: now[0])
    for i in range(4):
        announce(browser, lan, f"bogus-{i}", f"10.0.0.{i + 10}")
    announce(browser, lan, "real", "10.0.0.2")
    assert "https://10.0.0.2:8443" not in browser.peers()  # every place taken
    for i in range(4):  # each fails verification at its first poll
        browser.unverified(f"https://10.0.0.{i + 10}:8443")
        announce(browser, lan, f"bogus-{i}", f"10.0.0.{i + 10}")  # and announces again at once: held out
    announce(browser, lan, "real", "10.0.0.2")
    assert browser.peers() == ("https://10.0.0.2:8443",)
    now[0] += UNVERIFIED_HOLD_S + 1
    announce(browser, lan, "bogus-0", "10.0.0.10")  # looked at again later, to fail again if it is still bogus
    assert "https://10.0.0.10:8443" in browser.peers()


def test_without_peer_certificates_a_found_box_is_never_polled():
    browser = SimpleNamespace(peers=lambda: ("https://10.0.0.2:8443",))
    bare = Gateway.__new__(Gateway)
    bare.settings, bare.browser, bare._untrusted_logged = FleetSettings(role="gateway", peers=("http://127.0.0.1:8081",), mdns=True), browser, False
    assert bare.trusted_found() == ()
    bare.settings = FleetSettings(role="gateway", peers=("http://127.0.0.1:8081",), mdns=True,
                                  peer_certificates=("/etc/everycycle/fleet-peers/0.crt",))
    assert bare.trusted_found() == ("https://10.0.0.2:8443",)


def test_a_certificate_the_fleet_does_not_trust_is_told_apart_from_a_box_that_is_down():
    assert unverified_certificate("[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: self-signed")
    assert not unverified_certificate("[Errno 111] Connection refused") and not unverified_certificate(None)
