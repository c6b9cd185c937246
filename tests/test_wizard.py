"""The first-boot wizard: the same box.toml as a hand-written bundle, through the same apply."""

from __future__ import annotations

import asyncio
import json
import time
import tomllib

import pytest

from host_runtime.auth.keystore import KeyVerifier
from host_runtime.console.app import Dashboard
from host_runtime.box_status.reader import StatusConfig, StatusReader
from host_runtime.console.from_worker import draw_from_worker
from host_runtime.console.wizard import box_from_answers, context_for_memory
from tests.file_server import serve_files

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
    config = StatusConfig(run_dir=tmp_path / "run", serving_url="http://127.0.0.1:9", bmc_url=None,
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
            await _apply(pilot, wizard)
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


async def _apply(pilot, wizard) -> None:
    """Press the wizard's Apply button (scrolled into view) and give the apply its time."""
    wizard.query_one("#apply").scroll_visible(animate=False)
    await pilot.pause(0.2)
    await pilot.click("#apply")
    await pilot.pause(0.5)


def _provisioned_app(tmp_path, passphrase: str | None):
    from host_runtime.auth import admin_passphrase
    from host_runtime.common.atomic_file import atomic_write

    root = tmp_path / "root"
    atomic_write(root / "var/lib/everycycle/provisioned.json", b'{"provisioned": true, "history": []}')
    atomic_write(root / "etc/everycycle/api_keys.json", b'{"version": 1, "keys": [{"name": "x", "sha256": "00"}]}',
                 0o600)
    if passphrase:
        admin_passphrase.save(root, passphrase)
    config = StatusConfig(run_dir=tmp_path / "run", serving_url="http://127.0.0.1:9", bmc_url=None,
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


def _owner_state(root, bundle):
    """What an owner's box holds beside the keys: each a place a reset once left behind (hardening #35, item 5)."""
    from host_runtime.common.atomic_file import atomic_write

    files = {
        "etc/everycycle/fleet.key": b"ec-fleet-key-in-clear\n", "etc/everycycle/fleet.toml": b'role = "member"\n',
        "etc/everycycle/fleet-peers/peer-0.pem": b"PEM", "etc/everycycle/tls/api.key": b"KEY",
        "etc/everycycle/serving.toml": b"", "etc/everycycle/bmc.password": b"pw\n",
        "var/lib/everycycle/update/carry/files/etc/everycycle/api_keys.json": b"{}",
        "var/lib/everycycle/update/carry/manifest.json": b"{}", "var/cache/everycycle/prefix/0001.kv": b"PROMPT",
        "var/lib/everycycle/usage/usage.json": b"{}", "root/.ssh/authorized_keys": b"ssh-ed25519 AAA",
        "etc/systemd/network/10-everycycle-eth0.network": b"[Match]",
    }
    for rel, data in files.items():
        atomic_write(root / rel, data, 0o600)
    atomic_write(root / "etc/everycycle/defaults.env", b"EVERYCYCLE_LOG_DIR=/var/log/everycycle\n", 0o644)
    atomic_write(root / "var/log/everycycle/serving.log", b"prompt text in a log line\n", 0o644)
    atomic_write(root / "var/lib/everycycle/models/m.gguf", b"GGUF", 0o644)
    atomic_write(bundle / "box.toml", b"schema_version = 1\n", 0o600)
    atomic_write(bundle / "files/bmc.pass", b"pw\n", 0o600)
    return files



async def _open_wizard(pilot, app, passphrase: str = "correct horse"):
    """On a set-up box: `w`, the admin passphrase, and the wizard it opens."""
    await pilot.pause(0.3)
    await pilot.press("w")
    await pilot.pause(0.2)
    await pilot.press(*passphrase, "enter")
    await _until(pilot, lambda: app.screen.__class__.__name__ == "Wizard")
    return app.screen


async def _until(pilot, condition, timeout_s: float = 15.0) -> None:
    """Wait for what a key press leads to (a screen pushed, a notice shown) instead of a fixed pause, which a
    loaded machine overruns; fails with the condition unmet after timeout_s."""
    for _ in range(int(timeout_s / 0.05)):
        if condition():
            return
        await pilot.pause(0.05)
    assert condition(), "the console did not get there in time"

def test_a_reset_without_a_passphrase_needs_proof_of_presence_and_leaves_nothing_of_the_owner(tmp_path):
    """F then 'erase' reset the box for whoever was at tty1, and left the fleet key, the update's carried copy of
    the keys, the users' prompts and the bundle first boot applies again."""
    from host_runtime.auth.factory_reset import PRESENCE_TOKEN

    app, root = _provisioned_app(tmp_path, None)
    bundle = tmp_path / "bundle"
    owned = _owner_state(root, bundle)

    async def drive():
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause(0.3)
            await pilot.press("w")
            await _until(pilot, lambda: "locked" in str(app.query_one("#notice").render()))
            assert app.screen.__class__.__name__ != "Wizard"
            await pilot.press("F")
            await _until(pilot, lambda: PRESENCE_TOKEN in str(app.query_one("#notice").render()))
            assert len(app.screen_stack) == 1  # nothing asked: no token on the boot disk
            assert (root / "var/lib/everycycle/provisioned.json").exists()
            (bundle / PRESENCE_TOKEN).write_bytes(b"")
            await pilot.press("F")
            await _until(pilot, lambda: app.screen.query("#reset-help"))
            help_text = str(app.screen.query_one("#reset-help").render())
            assert "API keys" in help_text and "fleet key" in help_text and "prefix cache" in help_text
            await pilot.press(*"nope", "enter")
            await _until(pilot, lambda: not app.screen.query("#reset-help"))
            assert (root / "var/lib/everycycle/provisioned.json").exists()  # not confirmed: nothing erased
            await pilot.press("F")
            await _until(pilot, lambda: app.screen.query("#reset-help"))
            await pilot.press(*"erase", "enter")
            await _until(pilot, lambda: app.screen.__class__.__name__ == "Wizard")

    asyncio.run(drive())
    assert not (root / "var/lib/everycycle/provisioned.json").exists()
    assert json.loads((root / "etc/everycycle/api_keys.json").read_text())["keys"] == []
    left = [rel for rel in owned if (root / rel).exists()]
    assert left == []
    assert not (root / "var/lib/everycycle/update/carry").exists()
    assert sorted(p.name for p in (root / "etc/everycycle").iterdir()) == ["api_keys.json", "defaults.env", "tls"]
    assert list((root / "etc/everycycle/tls").iterdir()) == []  # kept for the front's own pair, emptied
    assert (root / "var/log/everycycle/serving.log").read_bytes() == b""  # emptied in place (kept open)
    assert (root / "var/lib/everycycle/models/m.gguf").exists()  # models stay
    assert list(bundle.iterdir()) == []  # the bundle and the presence token are gone


def test_a_reset_does_not_follow_a_link_the_services_planted(tmp_path):
    """The cache and log directories are the services' own: a link there must be removed, never followed."""
    from host_runtime.auth.factory_reset import factory_reset

    root, bundle = tmp_path / "root", tmp_path / "bundle"
    precious = tmp_path / "precious"
    precious.write_text("keep me")
    (root / "var/cache/everycycle").mkdir(parents=True)
    (root / "var/log/everycycle").mkdir(parents=True)
    (root / "var/cache/everycycle/link").symlink_to(precious)
    (root / "var/log/everycycle/serving.log").symlink_to(precious)
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir/inside").write_text("keep me too")
    (root / "var/cache/everycycle/dirlink").symlink_to(tmp_path / "dir")
    factory_reset(root, bundle)
    assert precious.read_text() == "keep me" and (tmp_path / "dir/inside").read_text() == "keep me too"
    assert not (root / "var/cache/everycycle/link").is_symlink()


def test_a_reset_with_a_passphrase_needs_it_and_wrong_ones_count_across_console_restarts(tmp_path):
    """The three-try lockout lived in the console's memory: a restarted console gave three fresh tries."""
    from host_runtime.auth import admin_passphrase

    app, root = _provisioned_app(tmp_path, "correct horse")
    (tmp_path / "bundle").mkdir()
    (tmp_path / "bundle" / "factory-reset").write_bytes(b"")  # presence is not enough where a passphrase is set

    async def wrong_three_times(app):
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause(0.3)
            await pilot.press("F")
            await pilot.pause(0.2)
            assert app.screen.__class__.__name__ == "AdminPassphrase"
            for attempt in range(3):
                await pilot.press(*"wrong horse", "enter")
                await pilot.pause(0.2)
                assert "wrong admin passphrase" in str(app.query_one("#notice").render())
                if attempt < 2:
                    await pilot.press("w")
                    await pilot.pause(0.2)
            await pilot.press("F")
            await pilot.pause(0.2)
            assert "try again in" in str(app.query_one("#notice").render())

    asyncio.run(wrong_three_times(app))
    restarted, _ = _provisioned_app(tmp_path, "correct horse")  # a new console process on the same box

    async def still_locked(app):
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause(0.3)
            await pilot.press("w")
            await pilot.pause(0.2)
            assert app.screen.__class__.__name__ != "AdminPassphrase"
            assert "try again in" in str(app.query_one("#notice").render())

    asyncio.run(still_locked(restarted))
    assert (root / "var/lib/everycycle/provisioned.json").exists()
    assert not admin_passphrase.attempt(root, "correct horse", time.time())  # locked: even the right one
    assert admin_passphrase.attempt(root, "correct horse", time.time() + admin_passphrase.LOCKOUT_S + 1)


def test_on_a_signed_image_the_wizard_applies_nothing(tmp_path):
    """An image built with BUNDLE_PUBKEY applied the wizard's unsigned configuration all the same."""
    from host_runtime.common.atomic_file import atomic_write
    from host_runtime.console.wizard import TRUSTED_BUNDLE_KEY

    root = tmp_path / "root"
    atomic_write(root / TRUSTED_BUNDLE_KEY, b"-----BEGIN PUBLIC KEY-----\n", 0o644)
    config = StatusConfig(run_dir=tmp_path / "run", serving_url="http://127.0.0.1:9", bmc_url=None,
                           provision_root=root, bundle_dir=tmp_path / "bundle")
    app = Dashboard(StatusReader(config), tick_s=30)

    async def drive():
        async with app.run_test(size=(120, 60)) as pilot:
            await pilot.pause(0.5)
            wizard = app.screen
            assert wizard.__class__.__name__ == "Wizard"
            assert "signed" in str(wizard.query_one("#result").render())
            assert wizard.query_one("#apply").disabled
            wizard.on_button_pressed(type("Pressed", (), {"button": wizard.query_one("#apply")})())
            await pilot.pause(0.3)

    asyncio.run(drive())
    assert not (root / "var/lib/everycycle/provisioned.json").exists()
    assert not (tmp_path / "bundle" / "box.toml").exists()


def test_the_wizard_offers_physical_links_only():
    from host_runtime.console.wizard import configurable_links

    # What discovery reports on this kind of machine: a virtio NIC beside two ifb links and loopback.
    network = [{"name": "eth0", "kind": "physical"}, {"name": "ifb0", "kind": "ifb"}, {"name": "ifb1", "kind": "ifb"},
               {"name": "lo", "kind": "loopback"}, {"name": "br0", "kind": "bridge"}, "junk"]
    assert [link["name"] for link in configurable_links(network)] == ["eth0"]
    assert configurable_links({"unavailable": "netlink: no"}) == []


def test_a_key_revoked_while_an_update_waits_does_not_come_back_with_the_new_slot(tmp_path):
    """`update apply` copies the keys; the new slot's first boot restores that copy, so a key revoked after the copy
    was taken came back (hardening #35, item 5)."""
    from host_runtime.auth.carried_keys import BOX_KEYS, refresh_carried
    from host_runtime.auth.keystore import create_key, load_keys, revoke_key
    from host_runtime.update import carry
    from host_runtime.update.system import UpdatePaths

    root = tmp_path / "root"
    (root / "etc/everycycle").mkdir(parents=True)
    keys = root / BOX_KEYS
    create_key(keys, "owner")
    create_key(keys, "leaked")
    paths = UpdatePaths(root=root, state=tmp_path / "state")
    assert not refresh_carried(keys, paths)  # no update waiting: nothing to take
    carry.snapshot(root, paths.carry)  # update apply
    revoke_key(keys, "leaked")
    assert not refresh_carried(tmp_path / "elsewhere.json", paths)  # not the box's key file
    assert refresh_carried(keys, paths)
    new_slot = tmp_path / "new-slot"
    carry.restore(paths.carry, new_slot)
    assert [k.name for k in load_keys(new_slot / BOX_KEYS)] == ["owner"]


def test_re_provisioning_from_the_wizard_lists_the_keys_and_revokes_those_ticked(tmp_path):
    """Re-provisioning kept every old key and nothing offered to revoke them (hardening #35, item 9)."""
    from host_runtime.auth.keystore import create_key, load_keys
    from textual.widgets import SelectionList

    app, root = _provisioned_app(tmp_path, "correct horse")
    keys = root / "etc/everycycle/api_keys.json"
    keys.unlink()
    create_key(keys, "laptop")
    create_key(keys, "old-ci")

    async def drive():
        async with app.run_test(size=(120, 80)) as pilot:
            wizard = await _open_wizard(pilot, app)
            listed = wizard.query_one("#revoke", SelectionList)
            assert [listed.get_option_at_index(i).value for i in range(listed.option_count)] == ["laptop", "old-ci"]
            listed.select("old-ci")
            await pilot.pause(0.2)
            assert str(wizard.query_one("#problems").render()) == "no problems"
            await _apply(pilot, wizard)
            assert "revoked: old-ci" in str(wizard.query_one("#result").render())

    asyncio.run(drive())
    assert sorted(k.name for k in load_keys(keys)) == ["laptop", "owner"]


def _public_key(kind: str = "ssh-ed25519") -> str:
    import base64
    import struct

    blob = struct.pack(">I", len(kind)) + kind.encode() + struct.pack(">I", 32) + bytes(range(32))
    return f"{kind} {base64.b64encode(blob).decode()} owner@laptop"


def test_authorized_keys_are_checked_line_by_line():
    from provisioning.validate import authorized_keys_problem

    good = _public_key()
    assert authorized_keys_problem(f"# the owner\n{good}\n\nfrom=\"10.0.0.0/8\" {_public_key('ssh-rsa')}\n") is None
    assert "private key" in authorized_keys_problem("-----BEGIN OPENSSH PRIVATE KEY-----\nb3Blbn...\n")
    assert "line 2 is not an SSH public key" in authorized_keys_problem(f"{good}\nhello there\n")
    damaged = good.split()
    assert "damaged" in authorized_keys_problem(f"{damaged[0]} AAAB{damaged[1][4:]}")  # its header cut
    assert "damaged" in authorized_keys_problem(f"ssh-rsa {damaged[1]}")  # the data names another type
    assert authorized_keys_problem("\n# nothing\n") == "holds no SSH public key"


def test_the_wizard_takes_an_ssh_key_for_the_admin(tmp_path):
    """The wizard collected no SSH key, so a box set up at its console could not be reached over SSH (#37)."""
    config = StatusConfig(run_dir=tmp_path / "run", serving_url="http://127.0.0.1:9", bmc_url=None,
                           provision_root=tmp_path / "root", bundle_dir=tmp_path / "bundle")
    app = Dashboard(StatusReader(config), tick_s=30)
    key = _public_key()

    async def drive():
        async with app.run_test(size=(120, 60)) as pilot:
            await pilot.pause(0.5)
            wizard = app.screen
            for wid, value in {"admin_passphrase": "correct horse", "admin_passphrase_again": "correct horse",
                               "ssh_key": "ssh-ed25519 not-base64"}.items():
                wizard.query_one(f"#{wid}").value = value
            await pilot.pause(0.3)
            assert "ssh.authorized_keys: line 1" in str(wizard.query_one("#problems").render())
            wizard.query_one("#ssh_key").value = key
            await pilot.pause(0.3)
            assert str(wizard.query_one("#problems").render()) == "no problems"
            await _apply(pilot, wizard)
            assert "applied bundle" in str(wizard.query_one("#result").render())

    asyncio.run(drive())
    written = tmp_path / "root" / "root/.ssh/authorized_keys"
    assert written.read_text() == key + "\n" and written.stat().st_mode & 0o777 == 0o600


# ---- the model page: the built-in model, a GGUF file, a URL; its size and the planner's verdict first (#37) -----


TOPOLOGY_16G = {"gpus": {"llama_devices": []},
                "memory": {"available_bytes": 12 << 30, "total_bytes": 16 << 30}}


def test_the_model_answers_make_box_toml_model_tables():
    from host_runtime.console.wizard import model_from_answers

    base = {"context_length": "8192"}
    assert model_from_answers(base) == {"source": "image", "context_length": 8192}
    assert model_from_answers({**base, "model_source": "pull", "model_location": " hf://o/r/m.gguf ",
                               "model_sha256": "ab" * 32}) == {
        "source": "pull", "url": "hf://o/r/m.gguf", "sha256": "ab" * 32, "context_length": 8192}
    assert model_from_answers({**base, "model_source": "file", "model_location": "/media/usb/Qwen3 8B.Q4_K_M.gguf"}) \
        == {"source": "store", "name": "Qwen3-8B.Q4_K_M", "context_length": 8192}


def test_a_models_verdict_comes_from_its_header_alone_and_says_why_it_does_not_fit(tmp_path):
    from host_runtime.engine.model import default_model_path
    from host_runtime.models.verdict import HEADER_BYTES, Verdict, VerdictError, verdict_for

    model = default_model_path()
    topology = tmp_path / "topology.json"
    topology.write_text(json.dumps(TOPOLOGY_16G))
    local = verdict_for(str(model), topology, 4096)
    assert local.fits and local.size_bytes == model.stat().st_size
    assert "fits: 4,096-token context of 8,192 trained" in local.text and "all on the CPU" in local.text
    server = serve_files(model.parent)
    try:
        remote = verdict_for(f"{server.base}/{model.name}", topology, 4096)
        assert remote == Verdict(True, model.stat().st_size, local.text)
        assert server.ranges == [f"bytes=0-{HEADER_BYTES[0] - 1}"]  # the header, never the whole file
        assert HEADER_BYTES[0] < model.stat().st_size
    finally:
        server.shutdown()
    topology.write_text(json.dumps({"gpus": {"llama_devices": []},
                                    "memory": {"available_bytes": 1 << 30, "total_bytes": 2 << 30}}))
    short = verdict_for(str(model), topology, 4096)
    assert not short.fits and "does not fit" in short.text and "host RAM would need" in short.text
    with pytest.raises(VerdictError, match="no such file"):
        verdict_for(str(tmp_path / "missing.gguf"), topology, 4096)
    (tmp_path / "notes.gguf").write_bytes(b"not a model at all")
    with pytest.raises(VerdictError):
        verdict_for(str(tmp_path / "notes.gguf"), topology, 4096)


def _wizard_app(tmp_path, topology: dict = TOPOLOGY_16G):
    from textual.app import App

    from host_runtime.console.wizard import Wizard

    (tmp_path / "run").mkdir(exist_ok=True)
    (tmp_path / "run" / "topology.json").write_text(json.dumps(topology))

    class WizardApp(App):
        def on_mount(self):
            self.push_screen(Wizard([{"name": "eth0", "state": "up", "addresses": [{"address": "10.9.0.20"}]}],
                                    16 << 30, tmp_path / "bundle", tmp_path / "root", tmp_path / "run" / "topology.json"))

    return WizardApp()


async def _verdict_shown(pilot, wizard, timeout: float = 20.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        await pilot.pause(0.2)
        shown = str(wizard.query_one("#model_verdict").render())
        if shown and not shown.startswith("reading"):
            return shown
    raise AssertionError("no verdict shown")


def test_a_gguf_file_is_judged_then_copied_into_the_store_and_served(tmp_path):
    from host_runtime.common import settings_file
    from host_runtime.engine.model import default_model_path
    from host_runtime.serving.settings import ServingSettings

    model = default_model_path()
    app = _wizard_app(tmp_path)

    async def drive():
        async with app.run_test(size=(120, 60)) as pilot:
            await pilot.pause(0.3)
            wizard = app.screen
            for wid, value in {"admin_passphrase": "correct horse", "admin_passphrase_again": "correct horse",
                               "model_location": str(model)}.items():
                wizard.query_one(f"#{wid}").value = value
            wizard.query_one("#model_source").value = "file"
            shown = await _verdict_shown(pilot, wizard)
            assert "SmolLM2-135M-Instruct.Q4_1: 94 MiB; fits: 8,192-token context" in shown
            assert str(wizard.query_one("#problems").render()) == "no problems"
            await _apply(pilot, wizard)
            deadline = time.monotonic() + 30
            while "applied bundle" not in str(wizard.query_one("#result").render()) and time.monotonic() < deadline:
                await pilot.pause(0.2)
            assert "applied bundle" in str(wizard.query_one("#result").render())

    asyncio.run(drive())
    root = tmp_path / "root"
    stored = root / "var/lib/everycycle/models/SmolLM2-135M-Instruct.Q4_1/SmolLM2-135M-Instruct.Q4_1.gguf"
    assert stored.read_bytes() == model.read_bytes()
    served = settings_file.load(ServingSettings, root / "etc/everycycle/serving.toml")
    assert served.model == "/var/lib/everycycle/models/SmolLM2-135M-Instruct.Q4_1/SmolLM2-135M-Instruct.Q4_1.gguf"
    assert tomllib.loads((tmp_path / "bundle" / "box.toml").read_text())["model"] == {
        "source": "store", "name": "SmolLM2-135M-Instruct.Q4_1", "context_length": 8192}


def test_a_url_that_does_not_fit_is_refused_before_anything_is_written(tmp_path):
    from host_runtime.engine.model import default_model_path

    server = serve_files(default_model_path().parent)
    url = f"{server.base}/{default_model_path().name}"
    app = _wizard_app(tmp_path, {"gpus": {"llama_devices": []},
                                 "memory": {"available_bytes": 1 << 30, "total_bytes": 2 << 30}})

    async def drive():
        async with app.run_test(size=(120, 60)) as pilot:
            await pilot.pause(0.3)
            wizard = app.screen
            for wid, value in {"admin_passphrase": "correct horse", "admin_passphrase_again": "correct horse",
                               "model_location": url}.items():
                wizard.query_one(f"#{wid}").value = value
            wizard.query_one("#model_source").value = "pull"
            await pilot.pause(0.3)
            assert "model.sha256" in str(wizard.query_one("#problems").render())  # a URL's pull needs its hash
            wizard.query_one("#model_sha256").value = "ab" * 32
            shown = await _verdict_shown(pilot, wizard)
            assert "does not fit" in shown and "94 MiB" in shown
            assert "model: it does not fit this box" in str(wizard.query_one("#problems").render())
            await _apply(pilot, wizard)
            assert not (tmp_path / "bundle" / "box.toml").exists()

    try:
        asyncio.run(drive())
    finally:
        server.shutdown()


def test_the_wizards_model_page_snapshot(snap_compare, tmp_path):
    """The model page as the owner sees it, with the verdict (a fixed topology: 16 GiB, no GPU; the file at a
    fixed path, as a USB stick's would be)."""
    from pathlib import Path

    from host_runtime.engine.model import default_model_path

    usb = Path("/tmp/everycycle-snapshot-usb")
    usb.mkdir(exist_ok=True)
    stick = usb / default_model_path().name
    if not stick.is_symlink():
        stick.symlink_to(default_model_path())

    async def judged(pilot):
        wizard = pilot.app.screen
        wizard.query_one("#model_source").value = "file"
        wizard.query_one("#model_location").value = str(stick)
        await _verdict_shown(pilot, wizard)

    assert snap_compare(_wizard_app(tmp_path), terminal_size=(120, 50), run_before=judged)


def test_a_verdict_that_arrives_as_the_console_quits_is_dropped(tmp_path):
    """CI (stop 63 again): the header worker's answer reached the wizard while the console was taking it down (still
    attached, its verdict line already gone) and NoMatches failed the whole app; the full suite here (2026-12-06)
    had the typing pause's timer do the same."""
    app, _ = _provisioned_app(tmp_path, "correct horse")

    async def drive():
        async with app.run_test(size=(120, 40)) as pilot:
            wizard = await _open_wizard(pilot, app)
            await wizard.query_one("#model_verdict").remove()
            await wizard.query_one("#result").remove()
            wizard._verdict = None
            key = wizard._model_key()
            wizard._judge(key)  # the typing pause's timer, firing late (CI and this session: NoMatches)
            await asyncio.to_thread(wizard._judged, key)  # the header worker, ending late
            await asyncio.to_thread(draw_from_worker, wizard, wizard._show_result, "a late line", True)
            await pilot.pause(0.2)
            # kept for the checks, only not shown (whether the model fits is not this test's: it follows the memory
            # free at the time, and once failed here under the full suite's load)
            assert wizard._verdict is not None and wizard._verdict[0] == key

    asyncio.run(drive())


def test_the_wizard_offers_the_catalogs_models_that_fit_largest_first_and_pulls_one_by_name(tmp_path):
    """#59: the model page's catalog choice lists the catalog's chat models that fit this box by size (16 GiB, no
    GPU: gpt-oss-20b's 12 GB first, no embedding, rerank or speech model), and the one chosen becomes a first-boot
    pull by its name with no sha256 asked (the Hub's listing gives it): the bundle checks, and serving pulls it as
    the store's qwen3-8b."""
    from host_runtime.console.wizard import catalog_choices, model_from_answers
    from host_runtime.serving.settings import ServingSettings, SettingsError

    offered = [value for _, value in catalog_choices(16 << 30)]
    assert offered == ["gpt-oss:20b", "qwen3:8b", "qwen2.5-coder:7b", "gemma3:4b", "qwen3:4b", "llama3.2:3b"]
    assert [value for _, value in catalog_choices(4 << 30)] == ["gemma3:4b", "qwen3:4b", "llama3.2:3b"]
    assert catalog_choices(1 << 30) == []
    app = _wizard_app(tmp_path)

    async def drive():
        async with app.run_test(size=(120, 60)) as pilot:
            await pilot.pause(0.3)
            wizard = app.screen
            for wid, value in {"admin_passphrase": "correct horse", "admin_passphrase_again": "correct horse"}.items():
                wizard.query_one(f"#{wid}").value = value
            wizard.query_one("#model_source").value = "catalog"
            await pilot.pause(0.3)
            assert wizard.query_one("#model_catalog").display and not wizard.query_one("#model_sha256").display
            assert wizard.query_one("#model_catalog").value == "gpt-oss:20b"  # the largest that fits, first
            wizard.query_one("#model_catalog").value = "qwen3:8b"
            await pilot.pause(0.3)
            box, _, problems = wizard.candidate()
            assert box["model"] == {"source": "pull", "url": "qwen3:8b", "context_length": 8192}
            assert not [p for p in problems if p.startswith("model.")], problems

    asyncio.run(drive())
    assert model_from_answers({"context_length": "4096", "model_source": "catalog", "model_catalog": "qwen3:4b"}) == {
        "source": "pull", "url": "qwen3:4b", "context_length": 4096}
    pulled = ServingSettings(pull_url="qwen3:8b")
    assert pulled.pulled_name == "qwen3-8b"
    assert ServingSettings(pull_url="hf://o/r:Q4_K_M").pulled_name == "r-Q4_K_M"
    for url, field in (("http://nas.lan/m.gguf", "sha256"), ("qwen3:70b", "url"), ("nothing-like-it", "url")):
        with pytest.raises(SettingsError) as refused:
            ServingSettings(pull_url=url)
        assert refused.value.field == field, (url, refused.value)
