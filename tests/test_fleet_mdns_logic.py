"""What the gateway's mDNS browser keeps (pure: its handler fed by hand, no sockets)."""

from __future__ import annotations

from zeroconf import ServiceStateChange

from host_runtime.fleet.mdns import SERVICE, PeerBrowser


class _Info:
    def __init__(self, address: str, port: int = 9443):
        self.port = port
        self._address = address

    def parsed_addresses(self):
        return [self._address]


class _Zeroconf:
    """Answers get_service_info from a table, as the LAN would."""

    def __init__(self):
        self.table: dict[str, _Info] = {}

    def get_service_info(self, service_type, name, timeout=0):
        return self.table.get(name)


def _announce(browser: PeerBrowser, zc: _Zeroconf, name: str, address: str) -> None:
    zc.table[name] = _Info(address)
    browser._changed(zc, SERVICE, name, ServiceStateChange.Added)


def test_a_goodbye_evicts_a_box_only_once_a_poll_of_it_fails():
    """The third hardening review: a forged goodbye (anyone on the LAN can send one) evicted a member at once."""
    browser, zc = PeerBrowser(), _Zeroconf()
    _announce(browser, zc, f"box-a.{SERVICE}", "192.0.2.10")
    _announce(browser, zc, f"box-b.{SERVICE}", "192.0.2.11")
    browser._changed(zc, SERVICE, f"box-a.{SERVICE}", ServiceStateChange.Removed)
    assert browser.peers() == ("https://192.0.2.10:9443", "https://192.0.2.11:9443")  # still polled
    browser.unanswered("https://192.0.2.11:9443")   # a failed poll of a box that said no goodbye: kept
    browser.unanswered("https://192.0.2.10:9443/")  # the box that said goodbye does not answer: gone
    assert browser.peers() == ("https://192.0.2.11:9443",)
    _announce(browser, zc, f"box-a.{SERVICE}", "192.0.2.10")  # back again
    assert "https://192.0.2.10:9443" in browser.peers()


def test_the_boxes_found_are_capped():
    browser, zc = PeerBrowser(max_found=3), _Zeroconf()
    for i in range(10):
        _announce(browser, zc, f"box-{i}.{SERVICE}", f"192.0.2.{i + 1}")
    assert len(browser.peers()) == 3
    _announce(browser, zc, f"box-1.{SERVICE}", "192.0.2.99")  # one already kept may move
    assert "https://192.0.2.99:9443" in browser.peers() and len(browser.peers()) == 3
