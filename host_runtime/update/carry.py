"""The box's own configuration, carried from the running slot to the one an update writes.

A new slot holds the image as built: the owner's settings (what provisioning wrote, the keys the box made) live
in the running slot's /etc. `update apply` copies them to the data partition before anything is written; the
first boot of the new slot copies them back before any service starts (everycycle-update-boot.service). A slot
that already carries this snapshot is left alone, so changes made on it afterwards stay.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import shutil
from pathlib import Path

from host_runtime.common.atomic_file import atomic_write, replace_directory

# Relative to the root. The image's own files in /etc/everycycle (the service environment, the bundle key it was
# built to trust) come with each slot and are never carried.
CARRIED = (
    "etc/everycycle/**",
    "etc/hostname",
    "etc/systemd/network/10-everycycle-*.network",
    "etc/ssh/ssh_host_*",
    "root/.ssh/authorized_keys",
)
IMAGE_OWNED = ("etc/everycycle/defaults.env", "etc/everycycle/bundle-signing.pub")
MARKER = "etc/everycycle/.carried"
MANIFEST = "manifest.json"


def carried_files(root: Path) -> list[str]:
    """The files of `root` that are carried, relative and sorted (regular files only)."""
    found = []
    for dirpath, _, files in os.walk(root / "etc"):
        for name in files:
            found.append(os.path.relpath(os.path.join(dirpath, name), root))
    if (root / "root/.ssh/authorized_keys").is_file():
        found.append("root/.ssh/authorized_keys")
    wanted = []
    for rel in sorted(set(found)):
        path = root / rel
        if path.is_symlink() or not path.is_file() or rel in IMAGE_OWNED or rel == MARKER:
            continue
        if any(fnmatch.fnmatchcase(rel, pattern.replace("**", "*")) for pattern in CARRIED):
            wanted.append(rel)
    return wanted


def snapshot(root: Path, dest: Path) -> str:
    """Copy the carried files to `dest` (replacing an older snapshot in one rename); returns its id."""
    partial = dest.with_name(dest.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True, mode=0o700)
    entries = []
    for rel in carried_files(root):
        st = (root / rel).stat()
        data = (root / rel).read_bytes()
        target = partial / "files" / rel
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        atomic_write(target, data, mode=0o600)
        entries.append({"path": rel, "mode": st.st_mode & 0o7777, "uid": st.st_uid, "gid": st.st_gid,
                        "sha256": hashlib.sha256(data).hexdigest()})
    manifest = json.dumps({"files": entries}, indent=2, sort_keys=True).encode()
    snapshot_id = hashlib.sha256(manifest).hexdigest()[:16]
    atomic_write(partial / MANIFEST, manifest, mode=0o600)
    replace_directory(partial, dest)
    return snapshot_id


def snapshot_id(dest: Path) -> str | None:
    try:
        return hashlib.sha256((dest / MANIFEST).read_bytes()).hexdigest()[:16]
    except OSError:
        return None


def restore(dest: Path, root: Path) -> list[str]:
    """Put a snapshot's files into `root` unless this root already carries it; returns the paths written."""
    ident = snapshot_id(dest)
    if ident is None:
        return []
    marker = root / MARKER
    try:
        if marker.read_text().strip() == ident:
            return []
    except OSError:
        pass
    written = []
    for entry in json.loads((dest / MANIFEST).read_text())["files"]:
        rel = entry["path"]
        if rel.startswith("/") or ".." in Path(rel).parts:
            continue
        data = (dest / "files" / rel).read_bytes()
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(target, data, mode=entry["mode"])
        if os.geteuid() == 0:
            os.chown(target, entry["uid"], entry["gid"])
        written.append(rel)
    atomic_write(marker, ident.encode() + b"\n", mode=0o644)
    return written
