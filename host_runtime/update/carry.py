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
from host_runtime.common.service_user import owner_of

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


def _ids(root: Path, table: str) -> dict[str, int]:
    """Names to ids in a root's /etc/passwd or /etc/group (read as files: the root need not be the running one)."""
    out = {}
    try:
        lines = (root / "etc" / table).read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        parts = line.split(":")
        if len(parts) >= 3 and parts[2].isdigit():
            out.setdefault(parts[0], int(parts[2]))
    return out


def snapshot(root: Path, dest: Path) -> str:
    """Copy the carried files to `dest` (replacing an older snapshot in one rename); returns its id."""
    partial = dest.with_name(dest.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True, mode=0o700)
    entries = []
    # Owners by name as well: the image assigns the services' user its uid per build, so a number from the old
    # slot may be nobody, or another user, on the new one.
    user_of = {uid: name for name, uid in _ids(root, "passwd").items()}
    group_of = {gid: name for name, gid in _ids(root, "group").items()}
    for rel in carried_files(root):
        st = (root / rel).stat()
        data = (root / rel).read_bytes()
        target = partial / "files" / rel
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        atomic_write(target, data, mode=0o600)
        entries.append({"path": rel, "mode": st.st_mode & 0o7777, "uid": st.st_uid, "gid": st.st_gid,
                        "user": user_of.get(st.st_uid), "group": group_of.get(st.st_gid),
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
    users, groups = _ids(root, "passwd"), _ids(root, "group")
    for entry in json.loads((dest / MANIFEST).read_text())["files"]:
        rel = entry["path"]
        if rel.startswith("/") or ".." in Path(rel).parts:
            continue
        data = (dest / "files" / rel).read_bytes()
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(target, data, mode=entry["mode"])
        if os.geteuid() == 0:
            os.chown(target, *_owner(entry, users, groups, owner_of(rel)))
        written.append(rel)
    atomic_write(marker, ident.encode() + b"\n", mode=0o644)
    return written


def _owner(entry: dict, users: dict[str, int], groups: dict[str, int], policy: str | None = None) -> tuple[int, int]:
    """The new root's ids for a carried file's owner, by name; a name the new root lacks gives root's (nobody else
    reads it), and a snapshot from before names were kept gives its numbers. A secret the new image gives to one
    service's user (`policy`: a release that split the services' users) goes to that user where the root has it."""
    if policy and policy in users:
        return users[policy], groups.get(policy, 0)
    uid = users.get(entry["user"], 0) if entry.get("user") else entry["uid"]
    gid = groups.get(entry["group"], 0) if entry.get("group") else entry["gid"]
    return uid, gid
