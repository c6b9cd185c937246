"""A/B updates under qemu, from outside, the owner's way: `everycycle update apply --from URL`, then a restart.

  update_check.py WORK [--only tamper,update,power-cut,rollback]

WORK holds what `make image-update-test` built: v1.raw (the disk, version V1), and the update files of
v2/ (the same tree as V1 with a changed version string) and v3/ (V1's tree with a deliberately broken serving
setting, so it can never pass its health gate). The files are served over HTTP on the host (qemu's user network
reaches it at 10.0.2.2). In order, on one box:

  tamper     a release with one byte changed, and one signed by another key, are refused before any write
  update     v1 -> v2: v2 boots, shows its version in /health, keeps v1's keys, settings and record, is blessed
  power-cut  qemu is killed while v3 is being written: the box boots v2 as before, and says the apply was cut off
  rollback   v3 applied and booted: it fails its health gate on every try, and the box is back on v2 by itself

Prints progress on stderr and one JSON summary (with the times) on stdout; exits 1 if a check failed.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from image.boot_check import (CheckFailed, QemuBox, box_system, check, run_and_report, say,  # noqa: E402
                              wait_until)

STEPS = ("tamper", "update", "power-cut", "rollback")
HOST_FROM_GUEST = "10.0.2.2"  # qemu's user network: the host's loopback
BOOT_TIMEOUT_S = 1200.0
TRIES = 3


class ReleaseServer:
    """The release folders over HTTP on the host's loopback, which qemu's user network reaches."""

    def __init__(self, root: Path):
        handler = functools.partial(_QuietHandler, directory=str(root))
        self.httpd = _QuietServer(("127.0.0.1", 0), handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def url(self, name: str) -> str:
        return f"http://{HOST_FROM_GUEST}:{self.port}/{name}/"

    def close(self) -> None:
        self.httpd.shutdown()


class _QuietServer(http.server.ThreadingHTTPServer):
    def handle_error(self, request, client_address) -> None:
        pass  # a box cut off mid-download (the power-cut step) resets its connection: expected here


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


def make_tampered(src: Path, dest: Path, other_key: Path | None = None) -> None:
    """A copy of a release with one byte of its kernel image changed, or (other_key) re-signed by another key."""
    from host_runtime.update import release as rel

    dest.mkdir(parents=True)
    for f in src.iterdir():
        (dest / f.name).symlink_to(f.resolve())
    sums = rel.release_of(rel.parse_sums((src / rel.SUMS).read_text()))
    if other_key is None:
        (dest / sums.uki_file).unlink()
        data = bytearray((src / sums.uki_file).read_bytes())
        data[len(data) // 2] ^= 0x01
        (dest / sums.uki_file).write_bytes(bytes(data))
    else:
        from host_runtime.common import ed25519

        (dest / rel.SIGNATURE).unlink()
        (dest / rel.SIGNATURE).write_text(ed25519.sign((src / rel.SUMS).read_bytes(), other_key.read_bytes()) + "\n")


def other_private_key(path: Path) -> Path:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    path.write_bytes(Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return path


def version_of(release_dir: Path) -> str:
    from host_runtime.update import release as rel

    return rel.release_of(rel.parse_sums((release_dir / rel.SUMS).read_text())).version


def health_system(box: QemuBox) -> dict:
    try:
        return box_system(box)
    except OSError:
        return {}  # not up yet (the wait goes on)


def update_status(box: QemuBox) -> dict:
    out = box.ssh("everycycle update status --json", timeout=60)
    if out.returncode != 0:
        raise ValueError(out.stderr)
    return json.loads(out.stdout)


def identity(box: QemuBox) -> dict:
    """What must survive an update: hostname, SSH host key, the API's key file, the local CA clients trust (the
    certificate it issues follows the box's addresses, so may be issued again at a boot), provisioning."""
    out = box.ssh("hostname; sha256sum /etc/ssh/ssh_host_ed25519_key.pub /etc/everycycle/api_keys.json "
                  "/etc/everycycle/box.toml /var/lib/everycycle/provisioned.json; "
                  "everycycle front ca --state-dir /etc/everycycle | grep '^SHA-256'", timeout=60)
    if out.returncode != 0:
        raise CheckFailed(f"could not read the box's identity: {out.stderr}")
    return {"lines": out.stdout.split("\n")}


def loader_settings(box: QemuBox) -> dict[str, str]:
    """systemd-boot's loader.conf on the box's ESP, setting by setting."""
    out = box.ssh("cat /efi/loader/loader.conf", timeout=60).stdout
    return dict(line.split(None, 1) for line in map(str.strip, out.splitlines())
                if line and not line.startswith("#") and len(line.split(None, 1)) == 2)


def slot_b_and_entries(box: QemuBox) -> tuple[str, list[str]]:
    """Root slot B's label (partition 3 of the virtio disk) and the kernel images on the ESP."""
    label = box.ssh("lsblk -no PARTLABEL /dev/vda3", timeout=60).stdout.strip()
    return label, sorted(box.ssh("ls /efi/EFI/Linux", timeout=60).stdout.split())


def apply(box: QemuBox, url: str, timeout: float = 1800) -> tuple[int, str, float]:
    t = time.monotonic()
    out = box.ssh(f"everycycle update apply --from {url}", timeout=timeout)
    return out.returncode, out.stdout + out.stderr, round(time.monotonic() - t, 1)


def what_the_box_says(box: QemuBox, seen: dict) -> str:
    """For a timed-out wait: the last /health system seen, the update record and the health gate's journal."""
    out = box.ssh("everycycle update status --json; journalctl -b --no-pager -o cat -u everycycle-health-gate "
                  "| tail -n 15; systemctl --failed --no-legend --plain", timeout=60)
    return f"last /health system {seen.get('system')}; on the box:\n{out.stdout[-3000:]}{out.stderr[-500:]}"


def wait_version(box: QemuBox, version: str, phase: str | None, deadline: float) -> dict:
    seen: dict = {}

    def probe():
        system = seen["system"] = health_system(box)
        if system.get("version") != version:
            return None
        if phase and (system.get("last_update") or {}).get("phase") != phase:
            return None
        return system

    return wait_until(box, f"version {version}" + (f" with the update {phase}" if phase else ""), deadline, probe,
                      explain=lambda: what_the_box_says(box, seen))


def step_tamper(box: QemuBox, server: ReleaseServer, work: Path, result: dict) -> None:
    before = slot_b_and_entries(box)
    for name, why in (("tampered", "one byte of the kernel image changed"), ("other-key", "signed by another key")):
        code, text, _ = apply(box, server.url(name), timeout=600)
        after = slot_b_and_entries(box)
        record = update_status(box)["last_update"] or {}
        result[f"tamper_{name}"] = {"exit": code, "message": text.strip().splitlines()[-1:], "phase": record.get("phase"),
                                    "slot_b": after[0], "entries": after[1]}
        say(f"{name} ({why}): exit {code}: {text.strip().splitlines()[-1:]}")
        if code == 0 or record.get("phase") != "refused":
            raise CheckFailed(f"a release with {why} was not refused: exit {code}, record {record}\n{text}")
        if after != before:
            raise CheckFailed(f"a refused release changed the disk: slot B / entries {before} -> {after}")


def step_update(box: QemuBox, server: ReleaseServer, v2: str, result: dict) -> None:
    before = identity(box)
    code, text, took = apply(box, server.url("v2"))
    result["apply_v2_s"] = took
    say(f"apply v2: exit {code} in {took} s: {text.strip().splitlines()[-1:]}")
    if code != 0:
        raise CheckFailed(f"update apply v2 failed:\n{text}")
    slot_b, entries = slot_b_and_entries(box)
    result["after_apply"] = {"slot_b": slot_b, "entries": entries}
    from host_runtime.update.record import parse_entry

    fresh = [e for e in map(parse_entry, entries) if e and e.version == v2]
    if slot_b != f"ec_{v2}" or [(e.tries_left, e.tries_done) for e in fresh] != [(TRIES, 0)]:
        raise CheckFailed(f"after apply: slot B {slot_b!r}, entries {entries}")
    t = time.monotonic()
    box.ssh("systemctl reboot", timeout=30)
    system = wait_version(box, v2, "blessed", time.monotonic() + BOOT_TIMEOUT_S)
    result["reboot_to_blessed_s"] = round(time.monotonic() - t, 1)
    result["v2_system"] = system
    say(f"v2 blessed {result['reboot_to_blessed_s']} s after the reboot: {system}")
    # The gate passed; systemd-bless-boot, which runs after boot-complete.target, drops the entry's counter.
    def blessed_entry():
        state = update_status(box)
        entry = next((e for e in state["boot_entries"] if e["version"] == v2), None)
        return state if entry and entry["tries_left"] is None else None

    status = wait_until(box, "systemd-bless-boot to keep v2's entry", time.monotonic() + 120, blessed_entry,
                        explain=lambda: what_the_box_says(box, {"system": system}))
    result["v2_boot_entries"] = status["boot_entries"]
    if system.get("slot") != "B":
        raise CheckFailed(f"v2 should run from slot B: {status}")
    after = identity(box)
    result["identity_kept"] = before == after
    if before != after:
        raise CheckFailed(f"the update lost the box's identity:\nbefore {before}\nafter  {after}")
    say("kept: hostname, SSH host key, API keys, box.toml, the provisioning record, the local CA clients trust")
    # The old key still works through the front: a real request, as a client would make it.
    check_health = check(box, time.monotonic(), 600)
    result["v2_completion"] = check_health.get("completion")


def step_power_cut(box: QemuBox, server: ReleaseServer, v2: str, v3: str, result: dict) -> None:
    box.ssh(f"systemd-run --unit=ec-update-test everycycle update apply --from {server.url('v3')}", timeout=30)

    def writing():
        phase = (update_status(box)["last_update"] or {}).get("phase")
        return phase == "writing" or None

    wait_until(box, "the apply to start writing", time.monotonic() + 900, writing)
    time.sleep(3)
    box.power_cut()
    say("power cut while v3 was being written")
    t = time.monotonic()
    box.boot()
    system = wait_version(box, v2, "interrupted", time.monotonic() + BOOT_TIMEOUT_S)
    result["power_cut"] = {"boot_s": round(time.monotonic() - t, 1), "system": system,
                           "entries": slot_b_and_entries(box)[1]}
    say(f"after the power cut: {system}")
    if any(e.startswith(f"everycycle_{v3}") for e in result["power_cut"]["entries"]):
        raise CheckFailed(f"a kernel image of the cut-off v3 is on the ESP: {result['power_cut']['entries']}")


def step_rollback(box: QemuBox, server: ReleaseServer, v2: str, v3: str, result: dict) -> None:
    code, text, took = apply(box, server.url("v3"))
    result["apply_v3_s"] = took
    if code != 0:
        raise CheckFailed(f"update apply v3 failed:\n{text}")
    t = time.monotonic()
    box.ssh("systemctl reboot", timeout=30)
    system = wait_version(box, v2, "rolled-back", time.monotonic() + BOOT_TIMEOUT_S * 2)
    result["rollback"] = {"reboot_to_back_on_v2_s": round(time.monotonic() - t, 1), "system": system}
    status = update_status(box)
    result["rollback"]["boot_entries"] = status["boot_entries"]
    say(f"back on v2 {result['rollback']['reboot_to_back_on_v2_s']} s after the reboot: {system}")
    bad = next((e for e in status["boot_entries"] if e["version"] == v3), None)
    if not bad or bad["tries_left"] != 0 or system.get("slot") != "B":
        raise CheckFailed(f"v3 should have used up its tries and v2 run from slot B: {status}")
    if "health gate" not in (system.get("last_update") or {}).get("reason", ""):
        raise CheckFailed(f"the record should say v3 failed its health gate: {system}")
    check(box, time.monotonic(), 600)


def main(argv: list[str]) -> int:
    import os

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("work", type=Path, help="v1.raw, v2/ and v3/ from make image-update-test")
    ap.add_argument("--only", default=",".join(STEPS), help=f"steps, in this order: {','.join(STEPS)}")
    ap.add_argument("--keep", action="store_true", help="keep the box's work directory afterwards")
    args = ap.parse_args(argv)
    steps = [s for s in args.only.split(",") if s]
    if unknown := set(steps) - set(STEPS):
        print(f"update_check: unknown steps {sorted(unknown)}", file=sys.stderr)
        return 2
    if os.geteuid() != 0:
        print("update_check: needs root (as image/boot_check.py)", file=sys.stderr)
        return 2
    v1_disk = args.work / "v1.raw"
    needs_v3 = {"power-cut", "rollback"} & set(steps)
    missing = [p for p in (v1_disk, args.work / "v2", *([args.work / "v3"] if needs_v3 else [])) if not p.exists()]
    if missing:
        print(f"update_check: missing {missing}: run make image-update-test", file=sys.stderr)
        return 2
    box_work = Path(tempfile.mkdtemp(prefix="everycycle-update-"))
    serve = box_work / "releases"
    serve.mkdir()
    for name in ("v2", "v3"):
        if (args.work / name).exists():
            (serve / name).symlink_to((args.work / name).resolve())
    make_tampered(args.work / "v2", serve / "tampered")
    make_tampered(args.work / "v2", serve / "other-key", other_private_key(box_work / "other.pem"))
    v2 = version_of(args.work / "v2")
    v3 = version_of(args.work / "v3") if needs_v3 else None
    server = ReleaseServer(serve)
    box = QemuBox(box_work)
    summary: dict = {"steps": steps, "v2": v2, "v3": v3}

    def body() -> None:
        t0 = time.monotonic()
        box.start(v1_disk)
        first = check(box, t0, BOOT_TIMEOUT_S)
        summary["v1"] = {k: first.get(k) for k in ("boot_to_health_s", "boot_to_ready_s", "system", "data_fs_bytes")}
        summary["loader"] = loader_settings(box)
        if summary["loader"].get("editor") != "no":  # the boot menu must not edit a command line (#35, item 4)
            raise CheckFailed(f"systemd-boot's editor is not off on the ESP: loader.conf {summary['loader']}")
        for step in steps:
            say(f"==> {step}")
            t = time.monotonic()
            {"tamper": lambda: step_tamper(box, server, box_work, summary),
             "update": lambda: step_update(box, server, v2, summary),
             "power-cut": lambda: step_power_cut(box, server, v2, v3, summary),
             "rollback": lambda: step_rollback(box, server, v2, v3, summary)}[step]()
            summary[f"{step}_step_s"] = round(time.monotonic() - t, 1)

    return run_and_report(box, box_work, summary, body, keep=args.keep, cleanup=server.close)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
