"""Updates (host_runtime/update): versions, signed releases, staging, the record, carried configuration, the
health gate's verdict, and the contracts between the image's files (repart.d, sysupdate.d) and the code.
The real systemd-sysupdate and systemd-boot run under qemu (image/update_check.py, make image-update-test)."""

from __future__ import annotations

import configparser
import functools
import http.server
import json
import os
import re
import subprocess
import threading
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from host_runtime.update import carry, gate, release, service, versioning
from host_runtime.update import record as rec
from host_runtime.update.errors import UpdateError
from host_runtime.update.fetch import Source, stage
from host_runtime.update.system import SLOTS, UpdatePaths, os_release_value, root_label, status

ROOT = Path(__file__).resolve().parent.parent
V1, V2 = "0.1.0.202612010023.33e78d2", "0.1.0.202612010023.33e78d2.2"


def key_pair() -> tuple[bytes, bytes]:
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return private, public


def make_release(directory: Path, version: str, private: bytes, root_bytes: bytes = b"root" * 1000) -> release.Release:
    directory.mkdir(parents=True, exist_ok=True)
    r = release.Release(version, {})
    (directory / r.root_file).write_bytes(subprocess.run(["zstd", "-q", "-c"], input=root_bytes, capture_output=True,
                                                         check=True).stdout)
    (directory / r.uki_file).write_bytes(b"MZ" + os.urandom(3000))
    return release.write(directory, version, private)


def box_paths(tmp_path: Path, version: str | None = V1) -> UpdatePaths:
    (tmp_path / "usr/lib").mkdir(parents=True, exist_ok=True)
    (tmp_path / "usr/lib/os-release").write_text('ID=debian\n' + (f'IMAGE_VERSION="{version}"\n' if version else ""))
    (tmp_path / "esp").mkdir(exist_ok=True)
    return UpdatePaths(state=tmp_path / "var/lib/everycycle/update", esp_entries=tmp_path / "esp",
                       trusted_key=tmp_path / "update-signing.pub", os_release=tmp_path / "usr/lib/os-release",
                       cmdline=tmp_path / "cmdline", root=tmp_path / "root", slot_bytes=64 << 20)


# ---- versions -------------------------------------------------------------------------------------------------

def test_versions_are_composed_from_the_commit_and_fit_a_gpt_label():
    v = versioning.compose("0.1.0", 1796037780, "33e78d2abcdef0123")  # 2026-11-30 11:23 UTC
    assert v == "0.1.0.202611301123.33e78d2"
    assert len(versioning.partition_label(v + ".3")) <= versioning.GPT_LABEL_MAX
    with pytest.raises(UpdateError, match="36"):
        versioning.check("0.1.0." + "9" * 40)
    with pytest.raises(UpdateError, match="only letters"):
        versioning.check("1.0+3")  # '+' would read as systemd-boot's tries counter


@pytest.mark.parametrize("older,newer", [
    (V1, V2), ("0.1.0.202612010023.ffffff0", "0.1.0.202612010024.0000000"), ("1.9", "1.10"),
    ("1.0~rc1", "1.0"), ("1.0-1", "1.0.1"), ("1.0", "1.0^p1"), ("1.0a", "1.0b"), ("1.0", "1.0.0"),
])
def test_versions_order_as_systemd_orders_them(older, newer):
    assert versioning.compare(older, newer) == -1
    assert versioning.compare(newer, older) == 1
    assert versioning.compare(newer, newer) == 0


# ---- releases: signature, list, staging ------------------------------------------------------------------------

def test_a_release_verifies_with_its_key_and_is_refused_with_another(tmp_path):
    private, public = key_pair()
    made = make_release(tmp_path / "r", V2, private)
    sums = (tmp_path / "r" / release.SUMS).read_bytes()
    sig = (tmp_path / "r" / release.SIGNATURE).read_bytes()
    assert release.verified_release(sums, sig, public) == made
    _, other_public = key_pair()
    with pytest.raises(UpdateError, match="another key"):
        release.verified_release(sums, sig, other_public)
    with pytest.raises(UpdateError, match="altered"):
        release.verified_release(sums.replace(b"*", b" ", 1), sig, public)


def test_the_signature_is_deterministic_so_two_builds_give_identical_update_files(tmp_path):
    private, _ = key_pair()
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
        for name in release.Release(V1, {}).files:
            (tmp_path / d / name).write_bytes(b"same bytes")
        release.write(tmp_path / d, V1, private)
    for name in (release.SUMS, release.SIGNATURE):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


@pytest.mark.parametrize("text,match", [
    ("nothex *everycycle_1.efi\n", "line 1"),
    (f"{'a' * 64} *../etc/passwd\n", "line 1"),
    (f"{'a' * 64} *everycycle_1.efi\n{'b' * 64} *everycycle_1.efi\n", "twice"),
])
def test_a_malformed_list_is_refused_naming_the_line(text, match):
    with pytest.raises(UpdateError, match=match):
        release.parse_sums(text)


def test_a_list_must_hold_one_root_and_its_kernel_image_and_nothing_else():
    d = "a" * 64
    with pytest.raises(UpdateError, match="exactly one"):
        release.release_of({"everycycle_1.efi": d})
    with pytest.raises(UpdateError, match="nothing else"):
        release.release_of({"everycycle_1.root.raw.zst": d, "everycycle_1.efi": d, "evil.sh": d})
    with pytest.raises(UpdateError, match="nothing else"):
        release.release_of({"everycycle_1.root.raw.zst": d, "everycycle_2.efi": d})


def test_staging_from_a_folder_verifies_every_hash_and_shows_progress(tmp_path):
    private, public = key_pair()
    root = os.urandom(9 << 20)
    made = make_release(tmp_path / "usb", V2, private, root_bytes=root)
    lines: list[str] = []
    got = stage(Source(str(tmp_path / "usb")), tmp_path / "staged", public, lines.append, expanded_bytes=len(root))
    assert got == made
    # The root image is staged expanded: systemd-sysupdate copies a local file's bytes into the slot as they are.
    assert sorted(p.name for p in (tmp_path / "staged").iterdir()) == sorted([made.root_staged_file, made.uki_file,
                                                                               release.SUMS, release.SIGNATURE])
    assert (tmp_path / "staged" / made.root_staged_file).read_bytes() == root
    assert any("MiB" in line and "100%" in line and "MiB/s" in line for line in lines), lines


def test_a_release_the_data_partition_cannot_hold_is_refused_before_copying(tmp_path):
    private, public = key_pair()
    make_release(tmp_path / "usb", V2, private)
    with pytest.raises(UpdateError, match="MiB free; the release needs"):
        stage(Source(str(tmp_path / "usb")), tmp_path / "staged", public, lambda _: None, expanded_bytes=1 << 60)
    assert not (tmp_path / "staged").exists() and not (tmp_path / "staged.partial").exists()


def test_a_changed_byte_is_refused_and_nothing_is_staged(tmp_path):
    private, public = key_pair()
    made = make_release(tmp_path / "usb", V2, private)
    data = bytearray((tmp_path / "usb" / made.uki_file).read_bytes())
    data[100] ^= 1
    (tmp_path / "usb" / made.uki_file).write_bytes(bytes(data))
    with pytest.raises(UpdateError, match=f"{made.uki_file}: sha256 .* altered or damaged"):
        stage(Source(str(tmp_path / "usb")), tmp_path / "staged", public, lambda _: None, expanded_bytes=0)
    assert not (tmp_path / "staged").exists()
    assert not (tmp_path / "staged.partial").exists()


def test_staging_over_http_from_the_lan(tmp_path):
    private, public = key_pair()
    made = make_release(tmp_path / "srv/rel", V2, private, root_bytes=os.urandom(3 << 20))
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path / "srv"))
    handler.log_message = lambda *a: None
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}/rel"
        assert stage(Source(url), tmp_path / "staged", public, lambda _: None, expanded_bytes=0) == made
        with pytest.raises(UpdateError, match="HTTP 404"):
            stage(Source(url + "/missing"), tmp_path / "staged2", public, lambda _: None, expanded_bytes=0)
    finally:
        httpd.shutdown()
    with pytest.raises(UpdateError, match="not a directory"):
        Source(str(tmp_path / "nowhere"))
    with pytest.raises(UpdateError, match="only a directory or an http"):
        Source("ftp://example/x")


def test_a_file_served_without_its_size_is_cut_off_at_a_root_slots_size(tmp_path):
    """The third hardening review: a download without Content-Length was copied without limit before its hash
    was checked. A server that declares no size now brings at most a root slot's bytes per file."""
    private, public = key_pair()
    root = os.urandom(1 << 20)
    made = make_release(tmp_path / "srv/rel", V2, private, root_bytes=root)

    from tests.servers import serve_unsized

    httpd = serve_unsized(tmp_path / "srv", made.root_file)
    try:
        with pytest.raises(UpdateError, match=re.escape(made.root_file) + ": it went on past .*a root slot"):
            stage(Source(f"http://127.0.0.1:{httpd.server_address[1]}/rel"), tmp_path / "staged", public,
                  lambda _: None, expanded_bytes=4 << 20)
    finally:
        httpd.shutdown()
    assert not (tmp_path / "staged").exists() and not (tmp_path / "staged.partial").exists()


# ---- apply: what is refused before sysupdate writes, and what the record says ------------------------------

def test_apply_refuses_a_tampered_release_without_writing_and_records_it(tmp_path):
    private, public = key_pair()
    paths = box_paths(tmp_path)
    paths.trusted_key.write_bytes(public)
    other, _ = key_pair()
    make_release(tmp_path / "usb", V2, other)
    writes: list[str] = []
    with pytest.raises(UpdateError, match="another key"):
        service.apply(Source(str(tmp_path / "usb")), paths, lambda _: None,
                      sysupdate=lambda v, say: writes.append(v))
    assert writes == []
    record = rec.load(paths.record)
    assert record["phase"] == rec.REFUSED and "another key" in record["reason"] and record["from"] == V1


def test_apply_writes_a_newer_release_through_sysupdate_and_refuses_a_downgrade(tmp_path):
    private, public = key_pair()
    paths = box_paths(tmp_path)
    paths.trusted_key.write_bytes(public)
    (paths.root / "etc/everycycle").mkdir(parents=True)
    (paths.root / "etc/hostname").write_text("box-1\n")
    make_release(tmp_path / "new", V2, private)
    writes: list[str] = []
    box = [paths]

    def sysupdate(version, say):
        # What sysupdate would write from: the staged, verified release; the record says it is writing.
        staged = sorted(p.name for p in box[0].staged.iterdir())
        r = release.Release(version, {})
        assert staged == sorted([r.root_staged_file, r.uki_file, release.SUMS, release.SIGNATURE])
        assert rec.load(box[0].record)["phase"] == rec.WRITING
        writes.append(version)

    service.apply(Source(str(tmp_path / "new")), paths, lambda _: None, sysupdate=sysupdate)
    assert writes == [V2]
    record = rec.load(paths.record)
    assert (record["phase"], record["target"], record["from"]) == (rec.INSTALLED, V2, V1)
    assert not paths.staged.exists(), "the staged copy is removed once written"
    assert carry.snapshot_id(paths.carry)
    # Running V2 now: V1's release is older.
    make_release(tmp_path / "old", V1, private)
    paths2 = box_paths(tmp_path / "b", V2)
    paths2.trusted_key.write_bytes(public)
    box[0] = paths2
    with pytest.raises(UpdateError, match="--allow-downgrade"):
        service.apply(Source(str(tmp_path / "old")), paths2, lambda _: None, sysupdate=sysupdate)
    service.apply(Source(str(tmp_path / "old")), paths2, lambda _: None, allow_downgrade=True, sysupdate=sysupdate)
    assert writes == [V2, V1]
    assert service.check(Source(str(tmp_path / "new")), paths2)["newer"] is False


def test_apply_on_a_machine_that_is_not_the_box_image_says_so(tmp_path):
    paths = box_paths(tmp_path, version=None)
    with pytest.raises(UpdateError, match="no IMAGE_VERSION"):
        service.apply(Source(str(tmp_path)), paths, lambda _: None)


@pytest.mark.system
def test_the_cli_refuses_with_one_line_not_a_traceback(tmp_path):
    out = subprocess.run([str(ROOT / ".venv/bin/everycycle"), "update", "check", "--from", str(tmp_path / "none")],
                         capture_output=True, text=True)
    assert out.returncode == 1
    assert out.stderr.startswith("everycycle update check: --from") and "Traceback" not in out.stderr


# ---- the record at boot ----------------------------------------------------------------------------------------

def entries(*names: str) -> list[rec.BootEntry]:
    return [rec.parse_entry(n) for n in names]


def test_boot_entries_are_read_as_systemd_boot_counts_them():
    e = rec.parse_entry(f"everycycle_{V2}+1-2.efi")
    assert (e.version, e.tries_left, e.tries_done, e.bad) == (V2, 1, 2, False)
    assert rec.parse_entry(f"everycycle_{V2}+0-3.efi").bad
    assert rec.parse_entry(f"everycycle_{V1}.efi").tries_left is None
    assert rec.parse_entry(f"everycycle_{V2}+3.efi").tries_left == 3
    assert rec.parse_entry("BOOTX64.EFI") is None


def test_reconcile_turns_what_the_boot_loader_did_into_an_outcome():
    installed = rec.advance(rec.begin({}, V2, V1), rec.INSTALLED, "written", target=V2)
    booting = rec.reconcile(installed, V2, entries(f"everycycle_{V1}.efi", f"everycycle_{V2}+2-1.efi"))
    assert booting["phase"] == rec.BOOTING
    assert rec.reconcile(booting, V2, []) is booting
    failed_gate = {**booting, "gate": "programs that will not run: serving FATAL"}
    back = rec.reconcile(failed_gate, V1, entries(f"everycycle_{V1}.efi", f"everycycle_{V2}+0-3.efi"))
    assert back["phase"] == rec.ROLLED_BACK
    assert "did not pass its health gate in 3 boots: programs that will not run" in back["reason"]
    # Not yet tried (the owner chose the old entry in the menu): nothing to say.
    assert rec.reconcile(installed, V1, entries(f"everycycle_{V2}+3.efi")) is installed
    gone = rec.reconcile(installed, V1, entries(f"everycycle_{V1}.efi"))
    assert gone["phase"] == rec.FAILED
    writing = rec.advance(installed, rec.WRITING, "")
    cut = rec.reconcile(writing, V1, entries(f"everycycle_{V1}.efi"))
    assert cut["phase"] == rec.INTERRUPTED and f"{V1} kept serving" in cut["reason"]
    blessed = rec.advance(booting, rec.BLESSED, "ok")
    assert rec.reconcile(blessed, V2, []) is blessed


def test_the_record_keeps_the_last_ten_updates():
    record: dict = {}
    for i in range(15):
        record = rec.advance(rec.begin(record, f"1.{i}", "1.0"), rec.BLESSED, "ok")
    assert len(record["history"]) == rec.HISTORY
    assert record["history"][0]["target"] == "1.13" and "history" not in record["history"][0]


def test_status_names_the_version_slot_and_last_update(tmp_path):
    paths = box_paths(tmp_path)
    paths.cmdline.write_text(f"console=ttyS0 root=PARTLABEL=ec_{V1} rw quiet\n")
    (paths.esp_entries / f"everycycle_{V1}.efi").write_bytes(b"")
    rec.save(paths.record, rec.advance(rec.begin({}, V1, "0.0.9"), rec.BLESSED, "ok"))
    state = status(paths)
    assert state["version"] == V1 and state["root_label"] == f"ec_{V1}" and state["label_matches_version"]
    assert state["slot"].startswith("unavailable")  # no such partition on this machine
    assert state["boot_entries"] == [{"name": f"everycycle_{V1}.efi", "version": V1, "tries_left": None,
                                      "tries_done": 0}]
    assert state["last_update"]["phase"] == rec.BLESSED
    assert status(paths, with_entries=False)["boot_entries"] is None
    assert os_release_value('IMAGE_VERSION="1.2"\n', "IMAGE_VERSION") == "1.2"
    assert root_label("root=/dev/sda1") is None


# ---- configuration carried into a new slot --------------------------------------------------------------------

def test_the_boxs_configuration_is_carried_into_a_new_slot_once(tmp_path):
    old, new = tmp_path / "old", tmp_path / "new"
    files = {"etc/everycycle/api_keys.json": (b'{"keys": []}', 0o600), "etc/everycycle/tls/api.key": (b"k", 0o600),
             "etc/everycycle/box.toml": (b"hostname = 'x'", 0o644), "etc/hostname": (b"box-1\n", 0o644),
             "etc/systemd/network/10-everycycle-eth0.network": (b"[Match]", 0o644),
             "etc/ssh/ssh_host_ed25519_key": (b"secret", 0o600), "root/.ssh/authorized_keys": (b"ssh-ed25519", 0o600),
             "etc/everycycle/defaults.env": (b"IMAGE'S OWN", 0o644), "etc/passwd": (b"root:x", 0o644)}
    for rel_path, (data, mode) in files.items():
        (old / rel_path).parent.mkdir(parents=True, exist_ok=True)
        (old / rel_path).write_bytes(data)
        os.chmod(old / rel_path, mode)
    (new / "etc/everycycle").mkdir(parents=True)
    (new / "etc/everycycle/defaults.env").write_bytes(b"NEW IMAGE'S OWN")
    carry.snapshot(old, tmp_path / "carry")
    assert oct(os.stat(tmp_path / "carry").st_mode & 0o777) == "0o700"
    written = carry.restore(tmp_path / "carry", new)
    assert sorted(written) == sorted(p for p in files if p not in ("etc/everycycle/defaults.env", "etc/passwd"))
    assert (new / "etc/everycycle/defaults.env").read_bytes() == b"NEW IMAGE'S OWN"
    assert not (new / "etc/passwd").exists()
    assert os.stat(new / "etc/everycycle/tls/api.key").st_mode & 0o777 == 0o600
    assert (new / "etc/hostname").read_text() == "box-1\n"
    # Changed on the new slot afterwards: a later boot leaves it alone.
    (new / "etc/hostname").write_text("renamed\n")
    assert carry.restore(tmp_path / "carry", new) == []
    assert (new / "etc/hostname").read_text() == "renamed\n"


# ---- the health gate ------------------------------------------------------------------------------------------

RUNNING = {name: "RUNNING" for name in gate.EXPECTED_PROGRAMS}


@pytest.mark.parametrize("programs,ready,failed,state,why", [
    (RUNNING, (200, '{"status": "ready"}'), [], gate.PASS, "every program RUNNING"),
    (RUNNING, (503, '{"reason": "loading"}'), [], gate.WAIT, "/ready answered 503: loading"),
    ({**RUNNING, "serving": "STARTING"}, None, [], gate.WAIT, "not RUNNING yet: serving STARTING"),
    ({**RUNNING, "serving": "FATAL"}, None, [], gate.FAIL, "serving FATAL"),
    ({k: v for k, v in RUNNING.items() if k != "bmc"}, None, [], gate.FAIL, "missing from supervisord: bmc"),
    (RUNNING, (200, "{}"), ["nginx.service", gate.GATE_UNIT], gate.FAIL, "failed units: nginx.service"),
    (RUNNING, (200, "{}"), [gate.GATE_UNIT], gate.PASS, "every program"),
    (None, None, [], gate.WAIT, "supervisord is not answering"),
    (RUNNING, (503, '{"state": "wedged", "reason": "wedged: no decode completed for 41 s"}'), [], gate.FAIL,
     "the engine is wedged: wedged: no decode"),
    (RUNNING, (503, '{"state": "starting", "reason": "starting: the first canary has run 40 s"}'), [], gate.WAIT,
     "first canary has run 40 s"),
])
def test_the_gate_passes_only_a_box_that_serves(programs, ready, failed, state, why):
    got_state, got_why = gate.verdict(programs, ready, failed)
    assert got_state == state and why in got_why


def test_the_gate_waits_for_a_slow_box_and_gives_up_at_its_deadline():
    now = [0.0]
    looks = iter([(None, None, []), (RUNNING, (503, "{}"), []), (RUNNING, (200, "{}"), [])])
    said: list[str] = []
    assert gate.wait_for_health(600, lambda: next(looks), said.append, clock=lambda: now[0],
                                sleep=lambda s: now.__setitem__(0, now[0] + s)) == (True, gate.verdict(
                                    RUNNING, (200, "{}"), [])[1])
    assert len(said) == 3
    ok, why = gate.wait_for_health(600, lambda: (RUNNING, (503, '{"reason": "loading"}'), []), said.append,
                                   clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s), quiet_s=60)
    assert not ok and why.startswith("not healthy: no sign of progress for 6")
    # A box whose load keeps moving keeps its time past the quiet limit, up to the whole timeout.
    progress = iter(range(10**6))
    start = now[0]
    ok, why = gate.wait_for_health(
        600, lambda: (RUNNING, (503, json.dumps({"state": "loading", "load_progress": next(progress)})), []),
        said.append, clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s), quiet_s=60)
    assert not ok and why.startswith("not healthy: not ready within 600 s") and now[0] - start >= 600


# ---- contracts between the image's files and this code ---------------------------------------------------------

def ini(path: Path) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str
    parser.read(path)
    return parser


def test_the_disk_layout_the_image_builds_is_the_one_the_box_reads():
    built = sorted((ROOT / "image/repart.d").glob("*.conf"))
    at_boot = sorted((ROOT / "image/disk-tree/etc/repart.d").glob("*.conf"))
    assert [p.name for p in built] == [p.name for p in at_boot], "systemd-repart matches definitions in order"
    types = [ini(p)["Partition"]["Type"] for p in built]
    assert types == [ini(p)["Partition"]["Type"] for p in at_boot] == ["esp", "root", "root", "linux-generic"]
    # Partition numbers follow the definitions' order: the slots the box names A and B.
    assert {i + 1: SLOTS.get(i + 1) for i, t in enumerate(types) if t == "root"} == SLOTS
    root_a, root_b, data = (ini(p)["Partition"] for p in built[1:])
    assert root_a["Label"] == versioning.LABEL_PREFIX + "@VERSION@" and root_b["Label"] == "_empty"
    assert root_a["SizeMinBytes"] == root_a["SizeMaxBytes"] == root_b["SizeMaxBytes"] == "@SLOT_SIZE@"
    fstab = (ROOT / "image/disk-tree/etc/fstab").read_text()
    assert f"PARTLABEL={data['Label']} /var " in fstab


def test_the_boot_menu_cannot_edit_a_command_line():
    """systemd-boot's editor is off on the ESP (hardening #35, item 4): the image's /efi is what the ESP is made of,
    and its loader.conf says `editor no` (image/update_check.py reads it back from a booted disk)."""
    esp = (ROOT / "image/repart.d/00-esp.conf").read_text().splitlines()
    assert "CopyFiles=/efi:/" in esp
    settings = [line.split() for line in (ROOT / "rootfs_overlay/efi/loader/loader.conf").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    assert ["editor", "no"] in settings


def test_sysupdates_transfers_match_the_release_and_the_box():
    root_t = ini(ROOT / "image/disk-tree/usr/lib/sysupdate.d/10-root.transfer")
    uki_t = ini(ROOT / "image/disk-tree/usr/lib/sysupdate.d/20-uki.transfer")
    r = release.Release("@v", {})
    for t in (root_t, uki_t):
        assert t["Source"]["Path"] == str(UpdatePaths().staged)
        assert t["Transfer"]["ProtectVersion"] == "%A", "the running version is never overwritten"
    assert root_t["Source"]["MatchPattern"] == r.root_staged_file
    assert uki_t["Source"]["MatchPattern"] == r.uki_file
    assert root_t["Target"]["MatchPattern"] == versioning.LABEL_PREFIX + "@v"
    assert int(uki_t["Target"]["TriesLeft"]) == service.TRIES
    assert all(rec.parse_entry(p.replace("@v", V2).replace("@l", "2").replace("@d", "1"))
               for p in uki_t["Target"]["MatchPattern"].split())
    assert UpdatePaths().esp_entries == Path("/efi") / uki_t["Target"]["Path"].lstrip("/")


def test_the_gate_unit_guards_boot_complete_and_restarts_on_failure():
    unit = ini(ROOT / "rootfs_overlay/etc/systemd/system/everycycle-health-gate.service")
    assert unit["Unit"]["Before"] == "boot-complete.target"
    assert unit["Install"]["RequiredBy"] == "boot-complete.target"
    assert unit["Unit"]["FailureAction"] == "reboot"
    assert unit["Service"]["ExecStart"].endswith("everycycle update gate")


@pytest.mark.system
def test_update_artifacts_are_the_disks_root_slot_and_identical_from_two_runs(tmp_path):
    """image/update_artifacts.py against a small GPT disk made here (sfdisk on a file; zstd)."""
    disk = tmp_path / "disk.raw"
    with open(disk, "wb") as f:
        f.truncate(8 << 20)
    layout = f'label: gpt\nstart=2048, size=4096, type=U\nstart=6144, size=4096, name="ec_{V1}"\n'
    subprocess.run(["sfdisk", "-q", str(disk)], input=layout, text=True, check=True)
    payload = os.urandom(4096 * 512)
    with open(disk, "r+b") as f:
        f.seek(6144 * 512)
        f.write(payload)
    (tmp_path / "uki.efi").write_bytes(b"MZ kernel")
    private, public = key_pair()
    (tmp_path / "key.pem").write_bytes(private)
    for out in ("a", "b"):
        subprocess.run([str(ROOT / ".venv/bin/python"), str(ROOT / "image/update_artifacts.py"), str(disk),
                        str(tmp_path / "uki.efi"), V1, str(tmp_path / "key.pem"), str(tmp_path / out)],
                       check=True, capture_output=True)
    assert {p.name: p.read_bytes() for p in (tmp_path / "a").iterdir()} == \
        {p.name: p.read_bytes() for p in (tmp_path / "b").iterdir()}
    made = release.verified_release((tmp_path / "a" / release.SUMS).read_bytes(),
                                    (tmp_path / "a" / release.SIGNATURE).read_bytes(), public)
    root = subprocess.run(["zstd", "-dc", str(tmp_path / "a" / made.root_file)], capture_output=True, check=True).stdout
    assert root == payload
    assert json.loads(json.dumps(made.sha256))  # plain data


def test_the_console_shows_the_version_slot_and_last_update_in_one_line():
    from host_runtime.console.status_text import system_line

    assert system_line({"version": "unavailable: no IMAGE_VERSION", "slot": "unavailable"}) is None
    line = system_line({"version": V2, "slot": "B", "last_update": {"target": V2, "phase": rec.BLESSED,
                                                                    "reason": "every program RUNNING"}})
    assert line == f"image {V2}, slot B; last update {V2}: blessed (every program RUNNING)"


def test_staging_progress_reaches_the_record_the_console_reads(tmp_path):
    paths = box_paths(tmp_path)
    record = rec.advance(rec.begin({}, V2, V1), rec.STAGING, "copying")
    lines: list[str] = []
    report = service._also_in_record(lines.append, paths, record, every_s=0)
    report("copying everycycle_x.efi: 12 MiB of 134 MiB (8%), 3 s left, 40.0 MiB/s")
    saved = rec.load(paths.record)
    assert lines and saved["phase"] == rec.STAGING and saved["reason"] == lines[0]


def test_what_a_cut_off_apply_staged_is_cleared_at_boot_and_before_the_next_apply(tmp_path):
    private, public = key_pair()
    paths = box_paths(tmp_path)
    paths.trusted_key.write_bytes(public)
    (paths.staged).mkdir(parents=True)
    (paths.staged / "everycycle_x.root.raw").write_bytes(b"\0" * 4096)  # left by a power cut
    rec.save(paths.record, rec.advance(rec.begin({}, V2, V1), rec.WRITING, "", target=V2))
    done = service.on_boot(paths, lambda _: None)
    assert done["phase"] == rec.INTERRUPTED and "being written" in done["reason"]
    assert not paths.staged.exists()
    (paths.staged.with_name("staged.partial")).mkdir()
    make_release(tmp_path / "usb", V2, private)
    service.apply(Source(str(tmp_path / "usb")), paths, lambda _: None, sysupdate=lambda v, say: None)
    assert not paths.staged.with_name("staged.partial").exists()


@pytest.mark.root
def test_carried_files_keep_their_owner_by_name_when_the_new_image_numbers_users_otherwise(tmp_path):
    """The third hardening review: carried files were restored by numeric uid, while the image assigns the
    services' user its uid per build: the old number may be nobody, or another user, on the new slot."""
    old, new = tmp_path / "old", tmp_path / "new"
    for root, uid in ((old, 990), (new, 991)):
        (root / "etc/everycycle").mkdir(parents=True)
        (root / "etc/passwd").write_text(f"root:x:0:0::/root:/bin/sh\neverycycle:x:{uid}:{uid}::/var/lib:/bin/false\n")
        (root / "etc/group").write_text(f"root:x:0:\neverycycle:x:{uid}:\n")
    key = old / "etc/everycycle/api_keys.json"
    key.write_bytes(b'{"keys": []}')
    os.chmod(key, 0o600)
    os.chown(key, 990, 990)
    carry.snapshot(old, tmp_path / "carry")
    assert "etc/everycycle/api_keys.json" in carry.restore(tmp_path / "carry", new)
    st = os.stat(new / "etc/everycycle/api_keys.json")
    assert (st.st_uid, st.st_gid) == (991, 991) and st.st_mode & 0o777 == 0o600


@pytest.mark.root
def test_secrets_carried_from_a_release_with_one_service_user_go_to_the_service_that_reads_each(tmp_path):
    """Hardening #35 item 6: one uid for every service meant one GGUF bug in an engine read the TLS key, the BMC
    password and the fleet key. A release that splits the users carries the old slot's files (all owned by
    everycycle) to their new owners, by name; what no service owns keeps its owner."""
    old, new = tmp_path / "old", tmp_path / "new"
    (old / "etc/everycycle/tls").mkdir(parents=True)
    (old / "etc/passwd").write_text("root:x:0:0::/root:/bin/sh\neverycycle:x:990:990::/var/lib:/bin/false\n")
    (old / "etc/group").write_text("root:x:0:\neverycycle:x:990:\n")
    (new / "etc").mkdir(parents=True)
    users = {"everycycle": 991, "everycycle-front": 992, "everycycle-bmc": 993, "everycycle-fleet": 994}
    (new / "etc/passwd").write_text("root:x:0:0::/root:/bin/sh\n" + "".join(
        f"{name}:x:{uid}:{uid}::/:/bin/false\n" for name, uid in users.items()))
    (new / "etc/group").write_text("root:x:0:\n" + "".join(f"{name}:x:{uid}:\n" for name, uid in users.items()))
    files = {"etc/everycycle/api_keys.json": 991, "etc/everycycle/tls/ca.key": 992, "etc/everycycle/tls/box.key": 992,
             "etc/everycycle/bmc.password": 993, "etc/everycycle/fleet.key": 994, "etc/everycycle/serving.toml": 991}
    for rel in files:
        (old / rel).write_bytes(b"secret")
        os.chmod(old / rel, 0o600)
        os.chown(old / rel, 990, 990)
    carry.snapshot(old, tmp_path / "carry")
    assert set(files) <= set(carry.restore(tmp_path / "carry", new))
    for rel, uid in files.items():
        st = os.stat(new / rel)
        assert (rel, st.st_uid, st.st_gid, st.st_mode & 0o777) == (rel, uid, uid, 0o600)
