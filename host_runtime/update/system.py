"""Where the box keeps what updates need, and what it is running now: the version (os-release's IMAGE_VERSION),
the slot (the root partition the kernel was told to mount) and the boot entries on the ESP. Read-only here."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from host_runtime.update import record as rec, versioning

# The root slots' partition numbers in image/repart.d (00-esp, 10-root-a, 20-root-b, 30-data).
SLOTS = {2: "A", 3: "B"}


@dataclass(frozen=True)
class UpdatePaths:
    state: Path = Path("/var/lib/everycycle/update")        # on the data partition: survives every update
    esp_entries: Path = Path("/efi/EFI/Linux")               # systemd-boot's unified kernel images
    trusted_key: Path = Path("/usr/share/everycycle/update-signing.pub")
    os_release: Path = Path("/usr/lib/os-release")
    cmdline: Path = Path("/proc/cmdline")
    root: Path = field(default=Path("/"))                   # where carried configuration is restored
    slot_bytes: int | None = None                            # a root slot's size; None: the running root's

    def slot_size(self) -> int:
        """What an expanded root image takes: the running root file system fills its slot."""
        return shutil.disk_usage(self.root).total if self.slot_bytes is None else self.slot_bytes

    @property
    def record(self) -> Path:
        return self.state / "record.json"

    @property
    def staged(self) -> Path:
        """systemd-sysupdate's source directory (image/sysupdate.d/*.transfer name it)."""
        return self.state / "staged"

    @property
    def carry(self) -> Path:
        return self.state / "carry"


def os_release_value(text: str, key: str) -> str | None:
    for line in text.splitlines():
        k, _, v = line.partition("=")
        if k.strip() == key:
            return v.strip().strip('"').strip("'") or None
    return None


def running_version(paths: UpdatePaths) -> str | None:
    try:
        return os_release_value(paths.os_release.read_text(), "IMAGE_VERSION")
    except OSError:
        return None


def root_label(cmdline: str) -> str | None:
    for word in cmdline.split():
        if word.startswith("root=PARTLABEL="):
            return word.split("=", 2)[2]
    return None


def slot_of_label(label: str, by_partlabel: Path = Path("/dev/disk/by-partlabel"),
                  sys_block: Path = Path("/sys/class/block")) -> str | None:
    try:
        device = os.path.basename(os.path.realpath(by_partlabel / label))
        number = int((sys_block / device / "partition").read_text())
    except (OSError, ValueError):
        return None
    return SLOTS.get(number)


def status(paths: UpdatePaths = UpdatePaths(), with_entries: bool = True) -> dict:
    """The running version and slot, the boot entries and the last update's record (for /health, the CLI and
    the console). Fields that cannot be read say so: a development machine has no slots. /health leaves out the
    boot entries: reading them would mount the ESP, root's alone, from the services' process."""
    try:
        label = root_label(paths.cmdline.read_text())
    except OSError:
        label = None
    version = running_version(paths)
    record = rec.load(paths.record)
    return {
        "version": version or "unavailable: no IMAGE_VERSION in os-release (not the box image)",
        "slot": (slot_of_label(label) if label else None)
        or "unavailable: not booted from an A/B slot (root=PARTLABEL=ec_<version>)",
        "root_label": label,
        "boot_entries": [{"name": e.name, "version": e.version, "tries_left": e.tries_left,
                          "tries_done": e.tries_done} for e in rec.entries_in(paths.esp_entries)]
        if with_entries else None,
        "last_update": {k: record.get(k) for k in ("target", "from", "phase", "reason", "updated_at")}
        if record.get("phase") else None,
        "label_matches_version": bool(label and version and versioning.version_of_label(label) == version),
    }
