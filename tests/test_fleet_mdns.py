"""Fleet peers found on the LAN by mDNS: a member announces its front from one network namespace, the gateway's
`fleet peers` finds it from another (real multicast over the test's bridge, python-zeroconf on both sides), and
loses it when the member's program stops (its goodbye)."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.fleet_hosts import Net
from tests.servers import Proc, everycycle, wait_for

pytestmark = [pytest.mark.root, pytest.mark.system]


def peers(net: Net, settings) -> dict:
    out = subprocess.run(net.run_in(0, everycycle("fleet", "peers", "--settings", str(settings), "--wait", "2",
                                                  "--json")), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_a_member_announced_by_mdns_is_a_peer_of_the_gateway_until_it_stops(tmp_path):
    net = Net(2)
    member = None
    try:
        gateway_toml = tmp_path / "gateway-fleet.toml"
        gateway_toml.write_text('role = "gateway"\npeers = ["http://127.0.0.1:8081"]\nmdns = true\n')
        assert peers(net, gateway_toml)["found_by_mdns"] == []   # nobody announces yet

        member_toml, front_toml = tmp_path / "member-fleet.toml", tmp_path / "front.toml"
        member_toml.write_text('role = "member"\nmdns = true\n')
        front_toml.write_text(f'listen = "{net.address(1)}"\nhttps_port = 9443\n')
        member = Proc(net.run_in(1, everycycle("fleet", "gateway", "--if-gateway", "--settings", str(member_toml),
                                               "--front-settings", str(front_toml))), tmp_path / "member.log")
        url = f"https://{net.address(1)}:9443"
        wait_for(lambda: url in peers(net, gateway_toml)["found_by_mdns"], 30, "the member found by mDNS", member)
        assert peers(net, gateway_toml)["peers"] == ["http://127.0.0.1:8081", url]   # fleet.toml's first

        member.stop()
        wait_for(lambda: url not in peers(net, gateway_toml)["found_by_mdns"], 30, "the member gone after its goodbye")
    finally:
        if member:
            member.stop()
        net.remove()
