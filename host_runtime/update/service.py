"""What `everycycle update` does on the box: check, apply (through systemd-sysupdate), the early-boot step and
the health gate. Files and processes are touched here; the decisions are in record, gate and versioning."""

from __future__ import annotations

import contextlib
import fcntl
import shutil
import subprocess
import time
from pathlib import Path

from host_runtime.update import carry, gate, versioning
from host_runtime.update import record as rec
from host_runtime.update.errors import UpdateError
from host_runtime.update.fetch import Source, signed_release, stage
from host_runtime.update.release import Release
from host_runtime.update.system import UpdatePaths, running_version

SYSUPDATE = Path("/usr/lib/systemd/systemd-sysupdate")
TRIES = 3  # image/sysupdate.d/20-uki.transfer: TriesLeft=


def _trusted_key(paths: UpdatePaths) -> bytes:
    try:
        return paths.trusted_key.read_bytes()
    except OSError:
        raise UpdateError(f"{paths.trusted_key}: this box has no update key (not the box image?)") from None


def _running(paths: UpdatePaths) -> str:
    version = running_version(paths)
    if not version:
        raise UpdateError(f"{paths.os_release} has no IMAGE_VERSION: this is not the box image, which updates "
                          f"from A/B slots")
    return version


def check(source: Source, paths: UpdatePaths) -> dict:
    """The release at `source`, verified, against what runs: nothing is copied or written."""
    running = _running(paths)
    release, _, _ = signed_release(source, _trusted_key(paths))
    order = versioning.compare(release.version, running)
    return {"running": running, "available": release.version,
            "newer": order > 0, "older": order < 0, "files": release.sha256}


@contextlib.contextmanager
def _one_at_a_time(paths: UpdatePaths):
    paths.state.mkdir(parents=True, exist_ok=True, mode=0o755)
    with open(paths.state / "lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UpdateError("another update is being applied") from None
        yield


def run_sysupdate(version: str, say, binary: Path = SYSUPDATE) -> None:
    """systemd-sysupdate writes the staged release into the idle slot (image/sysupdate.d/*.transfer): the root
    partition first, labelled ec_<v> only once written, then the kernel image with its tries counter."""
    if not binary.exists():
        raise UpdateError(f"{binary} is missing: the image lacks systemd-sysupdate")
    proc = subprocess.Popen([str(binary), "--no-pager", "update", version], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    tail: list[str] = []
    for line in proc.stdout:
        line = line.rstrip()
        if line:
            say(f"sysupdate: {line}")
            tail = (tail + [line])[-5:]
    if proc.wait() != 0:
        raise UpdateError(f"systemd-sysupdate failed (exit {proc.returncode}): {' / '.join(tail)}")


def _also_in_record(say, paths: UpdatePaths, record: dict, every_s: float = 2.0):
    """Progress lines to the CLI, and (at most every few seconds) into the record, which the console shows."""
    last = [0.0]

    def both(line: str) -> None:
        say(line)
        now = time.monotonic()
        if now - last[0] >= every_s:
            last[0] = now
            rec.save(paths.record, rec.advance(record, record["phase"], line))

    return both


def _clear_staging(paths: UpdatePaths) -> None:
    """What an apply cut off (a power cut, a kill) left staged: up to a root slot's size on the data partition."""
    for suffix in ("", ".partial", ".old"):
        shutil.rmtree(paths.staged.with_name(paths.staged.name + suffix), ignore_errors=True)


def apply(source: Source, paths: UpdatePaths, say, allow_downgrade: bool = False,
          sysupdate=run_sysupdate) -> Release:
    """Verify, stage and write a release into the idle slot; the running slot is never touched. The record
    says how far it got; an error leaves the box as it was (UpdateError)."""
    with _one_at_a_time(paths):
        _clear_staging(paths)
        running = _running(paths)
        record = rec.begin(rec.load(paths.record), "unknown", running)
        rec.save(paths.record, record)
        try:
            release, _, _ = signed_release(source, _trusted_key(paths))
            record = rec.advance(record, rec.STAGING, "copying and checking the release", target=release.version)
            rec.save(paths.record, record)
            order = versioning.compare(release.version, running)
            if order == 0:
                raise UpdateError(f"{running} is the version running now")
            if order < 0 and not allow_downgrade:
                raise UpdateError(f"{release.version} is older than the running {running}: a downgrade needs "
                                  f"--allow-downgrade")
            carry.snapshot(paths.root, paths.carry)
            stage(source, paths.staged, _trusted_key(paths), _also_in_record(say, paths, record),
                  expanded_bytes=paths.slot_size())
        except UpdateError as exc:
            rec.save(paths.record, rec.advance(record, rec.REFUSED, str(exc)))
            raise
        try:
            record = rec.advance(record, rec.WRITING, "systemd-sysupdate is writing the idle slot")
            rec.save(paths.record, record)
            sysupdate(release.version, say)
            rec.save(paths.record, rec.advance(record, rec.INSTALLED,
                                               f"written to the idle slot; the next boot tries it ({TRIES} tries) "
                                               f"and keeps it once its health gate passes"))
        except (UpdateError, OSError) as exc:
            rec.save(paths.record, rec.advance(record, rec.FAILED, str(exc)))
            raise UpdateError(str(exc)) from None
        finally:
            shutil.rmtree(paths.staged, ignore_errors=True)
        return release


def on_boot(paths: UpdatePaths, say) -> dict:
    """Early at each boot, before the services: bring the carried configuration into a new slot, and turn what
    the boot loader did into the update record's outcome."""
    written = carry.restore(paths.carry, paths.root)
    if written:
        say(f"carried {len(written)} configuration files into this slot: {', '.join(written)}")
        if "etc/hostname" in written and paths.root == Path("/"):
            hostname = (paths.root / "etc/hostname").read_text().strip()
            subprocess.run(["hostname", hostname], check=False)
    record = rec.load(paths.record)
    if record.get("phase") in rec.IN_APPLY:
        _clear_staging(paths)
    new = rec.reconcile(record, running_version(paths), rec.entries_in(paths.esp_entries))
    if new is not record:
        rec.save(paths.record, new)
        say(f"update {new.get('target')}: {new['phase']}: {new['reason']}")
    return new


def health_gate(paths: UpdatePaths, timeout_s: float, run_dir: Path, serving_socket: Path, say) -> bool:
    passed, why = gate.wait_for_health(timeout_s, lambda: gate.look(run_dir, serving_socket), say)
    record = rec.load(paths.record)
    if record.get("target") and record.get("target") == running_version(paths):
        if passed:
            record = rec.advance(record, rec.BLESSED, f"{why}; systemd-bless-boot keeps this slot")
        else:
            record = rec.advance(record, rec.BOOTING, f"health gate failed: {why}; restarting to try again or "
                                                      f"go back", gate=why)
        rec.save(paths.record, record)
    return passed
