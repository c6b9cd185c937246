"""The first-boot wizard: the same box.toml as a hand-written bundle, through the same apply."""

from __future__ import annotations

import asyncio
import json
import tomllib

from host_runtime.auth.keystore import KeyVerifier
from host_runtime.console.app import Dashboard
from host_runtime.console.data import ConsoleConfig, StatusReader
from host_runtime.console.wizard import box_from_answers, context_for_memory

HAND_WRITTEN = """
schema_version = 1
hostname = "shed-box"

[network]
interfaces = [{ name = "eth0", mode = "static", address = "10.9.0.20/24", gateway = "10.9.0.1", dns = ["10.9.0.1", "1.1.1.1"] }]

[api]
port = 8443
generate_keys = ["owner"]

[model]
source = "image"
context_length = 4096

[bmc]
mode = "none"

[power]
target_c = 72.0
ceiling_c = 85.0
"""
ANSWERS = {"hostname": "shed-box", "links": [{"name": "eth0", "mode": "static", "address": "10.9.0.20/24",
                                              "gateway": "10.9.0.1", "dns": "10.9.0.1, 1.1.1.1"}],
           "port": "8443", "context_length": "4096", "bmc_mode": "none", "target_c": "72", "ceiling_c": "85"}


def test_answers_make_the_same_box_as_the_hand_written_bundle():
    box, files = box_from_answers(ANSWERS)
    assert box == tomllib.loads(HAND_WRITTEN) and files == {}
    assert context_for_memory(4 * 2**30) == 4096 and context_for_memory(32 * 2**30) == 8192


def test_the_wizard_checks_as_typed_writes_applies_and_shows_the_key_once(tmp_path):
    config = ConsoleConfig(run_dir=tmp_path / "run", serving_url="http://127.0.0.1:9", bmc_url=None,
                           provision_root=tmp_path / "root", bundle_dir=tmp_path / "bundle")
    app = Dashboard(StatusReader(config), tick_s=30)

    async def drive():
        async with app.run_test(size=(120, 60)) as pilot:
            await pilot.pause(0.5)
            wizard = app.screen
            assert wizard.__class__.__name__ == "Wizard"  # not provisioned: the wizard comes first
            values = {"hostname": "shed-box", "address-0": "10.9.0.300/24", "gateway-0": "10.9.0.1",
                      "dns-0": "10.9.0.1, 1.1.1.1", "context_length": "4096", "target_c": "72", "ceiling_c": "85",
                      "admin_passphrase": "correct horse", "admin_passphrase_again": "correct hors"}
            wizard.query_one("#mode-0").value = "static"
            for wid, value in values.items():
                wizard.query_one(f"#{wid}").value = value
            await pilot.pause(0.3)
            problems = str(wizard.query_one("#problems").render())
            assert "network.interfaces[0].address" in problems  # checked as typed
            assert "the two admin passphrases differ" in problems
            wizard.query_one("#apply").scroll_visible(animate=False)
            await pilot.pause(0.2)
            await pilot.click("#apply")
            await pilot.pause(0.3)
            assert not (tmp_path / "bundle" / "box.toml").exists()  # nothing written while a field is wrong
            wizard.query_one("#address-0").value = "10.9.0.20/24"
            wizard.query_one("#admin_passphrase_again").value = "correct horse"
            await pilot.pause(0.3)
            assert str(wizard.query_one("#problems").render()) == "no problems"
            assert 'hostname = "shed-box"' in str(wizard.query_one("#preview").render())
            wizard.query_one("#apply").scroll_visible(animate=False)
            await pilot.pause(0.2)
            await pilot.click("#apply")
            await pilot.pause(0.5)
            result = str(wizard.query_one("#result").render())
            assert "applied bundle" in result
            key = wizard.generated["owner"]
            assert key in result
            await pilot.press("escape")
            await pilot.pause(0.2)
            assert app.screen.__class__.__name__ != "Wizard"
            return key

    key = asyncio.run(drive())
    written = tomllib.loads((tmp_path / "bundle" / "box.toml").read_text())
    assert written == tomllib.loads(HAND_WRITTEN)  # the same box.toml as the hand-written bundle
    root = tmp_path / "root"
    assert json.loads((root / "var/lib/everycycle/provisioned.json").read_text())["hostname"] == "shed-box"
    assert KeyVerifier(root / "etc/everycycle/api_keys.json").verify(key) == "owner"
    assert key not in (root / "etc/everycycle/api_keys.json").read_text()
    from host_runtime.auth import admin_passphrase

    assert admin_passphrase.check(root, "correct horse") and not admin_passphrase.check(root, "wrong horse")
    assert "correct horse" not in (root / admin_passphrase.PASSPHRASE_FILE).read_text()
    assert (root / admin_passphrase.PASSPHRASE_FILE).stat().st_mode & 0o777 == 0o600


def _provisioned_app(tmp_path, passphrase: str | None):
    from host_runtime.auth import admin_passphrase
    from host_runtime.common.atomic_file import atomic_write

    root = tmp_path / "root"
    atomic_write(root / "var/lib/everycycle/provisioned.json", b'{"provisioned": true, "history": []}')
    atomic_write(root / "etc/everycycle/api_keys.json", b'{"version": 1, "keys": [{"name": "x", "sha256": "00"}]}',
                 0o600)
    if passphrase:
        admin_passphrase.save(root, passphrase)
    config = ConsoleConfig(run_dir=tmp_path / "run", serving_url="http://127.0.0.1:9", bmc_url=None,
                           provision_root=root, bundle_dir=tmp_path / "bundle")
    return Dashboard(StatusReader(config), tick_s=30), root


def test_on_a_set_up_box_the_wizard_needs_the_admin_passphrase(tmp_path):
    """`w` reopened the wizard for whoever was at the keyboard, and re-provisioning replaced every API key."""
    app, _ = _provisioned_app(tmp_path, "correct horse")

    async def drive():
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause(0.3)
            assert len(app.screen_stack) == 1  # provisioned: the dashboard, no wizard
            await pilot.press("w")
            await pilot.pause(0.2)
            assert app.screen.__class__.__name__ == "AdminPassphrase"
            await pilot.press(*"wrong horse", "enter")
            await pilot.pause(0.3)
            assert app.screen.__class__.__name__ != "Wizard"
            assert "wrong admin passphrase" in str(app.query_one("#notice").render())
            await pilot.press("w")
            await pilot.pause(0.2)
            await pilot.press(*"correct horse", "enter")
            await pilot.pause(0.5)
            assert app.screen.__class__.__name__ == "Wizard"

    asyncio.run(drive())


def test_without_a_passphrase_the_wizard_is_locked_and_a_factory_reset_says_what_it_erases(tmp_path):
    app, root = _provisioned_app(tmp_path, None)

    async def drive():
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause(0.3)
            await pilot.press("w")
            await pilot.pause(0.2)
            assert app.screen.__class__.__name__ != "Wizard"
            assert "locked" in str(app.query_one("#notice").render())
            await pilot.press("F")
            await pilot.pause(0.2)
            assert "API keys" in str(app.screen.query_one("#reset-help").render())
            await pilot.press(*"nope", "enter")
            await pilot.pause(0.2)
            assert (root / "var/lib/everycycle/provisioned.json").exists()  # not confirmed: nothing erased
            await pilot.press("F")
            await pilot.pause(0.2)
            await pilot.press(*"erase", "enter")
            await pilot.pause(0.5)
            assert app.screen.__class__.__name__ == "Wizard"

    asyncio.run(drive())
    assert not (root / "var/lib/everycycle/provisioned.json").exists()
    assert json.loads((root / "etc/everycycle/api_keys.json").read_text())["keys"] == []


def test_the_wizard_offers_physical_links_only():
    from host_runtime.console.wizard import configurable_links

    # What discovery reports on this kind of machine: a virtio NIC beside two ifb links and loopback.
    network = [{"name": "eth0", "kind": "physical"}, {"name": "ifb0", "kind": "ifb"}, {"name": "ifb1", "kind": "ifb"},
               {"name": "lo", "kind": "loopback"}, {"name": "br0", "kind": "bridge"}, "junk"]
    assert [link["name"] for link in configurable_links(network)] == ["eth0"]
    assert configurable_links({"unavailable": "netlink: no"}) == []
