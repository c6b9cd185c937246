"""The fleet's virtual address (pure): keepalived's configuration from fleet.toml, and the interface it goes on."""

from __future__ import annotations

import pytest

from host_runtime.common.settings_file import SettingsError
from host_runtime.fleet.settings import FleetSettings
from host_runtime.fleet.vrrp import Failover, FailoverError, interface_for, render

GATEWAY = dict(role="gateway", peers=("http://127.0.0.1:8081",))
LINKS = [{"name": "lo", "addresses": [{"family": "ipv4", "address": "127.0.0.1", "prefixlen": 8}]},
         {"name": "enp3s0", "addresses": [{"family": "ipv4", "address": "192.168.1.11", "prefixlen": 24},
                                          {"family": "ipv6", "address": "fe80::1", "prefixlen": 64}]},
         {"name": "enp4s0", "addresses": [{"family": "ipv4", "address": "10.9.0.2", "prefixlen": 24}]}]


def test_the_configuration_holds_the_address_as_a_standby_that_never_takes_it_back():
    s = FleetSettings(**GATEWAY, virtual_address="192.168.1.50/24", vrrp_priority=150, vrrp_peers=("192.168.1.12",))
    conf = render(s, Failover(interface="enp3s0", front_port=443))
    assert "    state BACKUP\n    nopreempt\n" in conf           # a gateway coming back stays the standby
    assert "    priority 150\n" in conf and "    virtual_router_id 51\n" in conf
    assert "192.168.1.50/24 dev enp3s0" in conf
    assert "unicast_peer {\n        192.168.1.12\n    }" in conf
    # The check: the front's port and the router's, both on loopback, as an unprivileged user.
    assert "</dev/tcp/127.0.0.1/443 && </dev/tcp/127.0.0.1/8090" in conf
    assert "script_user nobody" in conf and "enable_script_security" in conf
    assert "unicast_peer" not in render(FleetSettings(**GATEWAY, virtual_address="192.168.1.50/24"),
                                        Failover(interface="enp3s0", front_port=443))   # multicast adverts


def test_the_interface_is_the_one_on_the_addresss_network_or_the_one_named():
    s = FleetSettings(**GATEWAY, virtual_address="192.168.1.50/24")
    assert interface_for(s, LINKS) == "enp3s0"
    # Held here already (a restart): the address itself does not count, the box's own on that network does.
    held = [*LINKS[:1], {**LINKS[1], "addresses": [*LINKS[1]["addresses"],
                                                   {"family": "ipv4", "address": "192.168.1.50", "prefixlen": 24}]}]
    assert interface_for(s, held) == "enp3s0"
    assert interface_for(FleetSettings(**GATEWAY, virtual_address="192.168.1.50/24", vrrp_interface="bond0"),
                         LINKS) == "bond0"
    with pytest.raises(FailoverError, match="no interface has an address on 172.16.0.0/16"):
        interface_for(FleetSettings(**GATEWAY, virtual_address="172.16.0.9/16"), LINKS)
    two = [*LINKS, {"name": "enp5s0", "addresses": [{"family": "ipv4", "address": "192.168.1.13", "prefixlen": 24}]}]
    with pytest.raises(FailoverError, match=r"several interfaces .*\(enp3s0, enp5s0\)"):
        interface_for(s, two)


@pytest.mark.parametrize("kw,field", [
    (dict(virtual_address="192.168.1.50"), "virtual_address"),
    (dict(virtual_address="192.168.1.0/24"), "virtual_address"),
    (dict(virtual_address="fd00::5/64"), "virtual_address"),
    (dict(virtual_address="192.168.1.50/24", vrrp_router_id=0), "vrrp_router_id"),
    (dict(virtual_address="192.168.1.50/24", vrrp_priority=True), "vrrp_priority"),
    (dict(virtual_address="192.168.1.50/24", vrrp_interface="eth0/1"), "vrrp_interface"),
    (dict(vrrp_peers=("192.168.1.12",)), "vrrp_peers"),
])
def test_bad_failover_settings_are_refused_naming_the_field(kw, field):
    with pytest.raises(SettingsError) as err:
        FleetSettings(**GATEWAY, **kw)
    assert err.value.field == field
    with pytest.raises(SettingsError, match="only used on a gateway"):
        FleetSettings(role="member", virtual_address="192.168.1.50/24")
