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
        # found, but without peer_certificates to vouch for it never polled: no fleet key, no prompts (#56, item 9)
        listed = peers(net, gateway_toml)
        assert listed["peers"] == ["http://127.0.0.1:8081"] and listed["found_untrusted"] == [url]
        certified = tmp_path / "certified-fleet.toml"
        certified.write_text(gateway_toml.read_text() + f'peer_certificates = ["{tmp_path / "peer.crt"}"]\n')
        (tmp_path / "peer.crt").write_text("")  # the peers command lists; the gateway loads and checks it
        assert peers(net, certified)["peers"] == ["http://127.0.0.1:8081", url]   # fleet.toml's first

        member.stop()
        wait_for(lambda: url not in peers(net, gateway_toml)["found_by_mdns"], 30, "the member gone after its goodbye")
    finally:
        if member:
            member.stop()
        net.remove()


LOOKUP = """
import json, sys
from zeroconf import IPVersion, Zeroconf
zc = Zeroconf(ip_version=IPVersion.V4Only)
info = zc.get_service_info("_https._tcp.local.", sys.argv[1] + "._https._tcp.local.", timeout=3000)
print(json.dumps(None if info is None else {"server": info.server, "port": info.port,
                                            "addresses": info.parsed_addresses()}))
zc.close()
"""


def test_every_box_is_name_dot_local_on_the_lan(tmp_path):
    """A new DHCP lease broke clients that connect by IP, and the box had no .local name (#37): the fleet program,
    on every box whatever its role, announces HOSTNAME.local and the API as an _https._tcp service; the
    front's certificate names HOSTNAME.local."""
    import socket
    import sys

    from host_runtime.front.tls import issue_leaf, leaf_paths, make_local_ca

    net = Net(2)
    box = None
    name = socket.gethostname().split(".")[0]  # the namespaces share the machine's name

    def lookup():
        out = subprocess.run(net.run_in(0, [sys.executable, "-c", LOOKUP, name]), capture_output=True, text=True,
                             timeout=30)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    try:
        fleet_toml, front_toml = tmp_path / "fleet.toml", tmp_path / "front.toml"
        fleet_toml.write_text('role = "none"\n')
        front_toml.write_text(f'listen = "{net.address(1)}"\nhttps_port = 9443\n')
        box = Proc(net.run_in(1, everycycle("fleet", "gateway", "--if-gateway", "--settings", str(fleet_toml),
                                            "--front-settings", str(front_toml))), tmp_path / "box.log")
        wait_for(lambda: lookup() is not None, 30, f"{name}.local found by mDNS", box)
        found = lookup()
        assert found == {"server": f"{name}.local.", "port": 9443, "addresses": [net.address(1)]}
        box.stop()
        front_toml.write_text(f'listen = "{net.address(1)}"\nhttps_port = 9443\nlan_name = false\n')
        quiet = Proc(net.run_in(1, everycycle("fleet", "gateway", "--if-gateway", "--settings", str(fleet_toml),
                                              "--front-settings", str(front_toml))), tmp_path / "quiet.log")
        try:
            wait_for(lambda: "nothing to run" in quiet.log(), 30, "the idle fleet program", quiet)
            assert lookup() is None  # the owner turned it off: nothing announced
        finally:
            quiet.stop()
    finally:
        if box:
            box.stop()
        net.remove()
    pair = leaf_paths(tmp_path / "state")
    make_local_ca(pair.ca, "shed-box")
    issue_leaf(pair.ca, pair, set(), "shed-box")
    from cryptography import x509

    names = x509.load_pem_x509_certificate(pair.certificate.read_bytes()).extensions.get_extension_for_class(
        x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    assert "shed-box.local" in names
