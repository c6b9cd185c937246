"""A factory reset from the console: what proves the person at the keyboard may do it, and what it erases.

Whoever is at tty1 (or at a BMC's remote console) is not yet the owner. With an admin passphrase set, the reset
asks for it (wrong ones count on disk: admin_passphrase.attempt). Without one, it asks for proof of presence: a
file named `factory-reset` in the boot disk's everycycle folder (the ESP, root's alone on the box), which only
someone holding the disk, or already root, can make. The reset consumes it.

The reset leaves nothing of the owner behind: every setting and secret in /etc/everycycle (the image's own files
stay), the fleet's key and peers, the update's carried copy of them (the next slot's first boot would restore
it), the users' prompts kept as KV on disk, per-key usage, the logs' contents, the admin SSH keys, the network
settings and the bundle on the boot disk (first boot would apply it again). Models and the system stay."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

from host_runtime.auth import admin_passphrase
from host_runtime.common.atomic_file import atomic_write
from host_runtime.common.service_user import service_owner
from host_runtime.update.carry import IMAGE_OWNED

PRESENCE_TOKEN = "factory-reset"
KEYS_FILE = "etc/everycycle/api_keys.json"

# Removed (files, or whole directories), relative to the root.
ERASED = (
    "var/lib/everycycle/provisioned.json",
    admin_passphrase.LOCKOUT_FILE,
    "var/lib/everycycle/update/carry",          # the update's snapshot of /etc/everycycle, TLS and fleet keys
    "var/lib/everycycle/update/carry.partial",
    "root/.ssh/authorized_keys",
)
ERASED_GLOBS = ("etc/systemd/network/10-everycycle-*.network",)
# Emptied, the directory itself kept (the image made it with its owner and mode).
EMPTIED = (
    "etc/everycycle/tls",         # first (kept: the image made it 0700 for the front, which writes its own pair)
    "etc/everycycle",             # settings, API keys, TLS, BMC password, fleet key and peers, passphrase
    "var/cache/everycycle",       # the prefix cache's disk tier: users' prompts as KV state
    "var/lib/everycycle/usage",   # per-key usage
)
# Files truncated in place: supervisord and the services keep their logs open.
TRUNCATED = ("var/log/everycycle",)


def proof_needed(root: Path) -> str:
    """'passphrase' where the box has an admin passphrase, else 'presence' (the token file on the boot disk)."""
    return "passphrase" if admin_passphrase.stored(root) is not None else "presence"


def presence_shown(bundle_dir: Path) -> bool:
    path = Path(bundle_dir) / PRESENCE_TOKEN
    return path.is_file() and not path.is_symlink()


def how_to_show_presence(bundle_dir: Path) -> str:
    return (f"this box has no admin passphrase: to prove you hold it, make an empty file named {PRESENCE_TOKEN} in "
            f"the everycycle folder of the boot disk's EFI partition ({Path(bundle_dir) / PRESENCE_TOKEN}), "
            "then press F again")


def describe() -> str:
    return ("Factory reset erases: this box's API keys, its box.toml and every service's settings, the TLS "
            "certificate and key and the box's local CA (clients trust the new one afterwards), the BMC password, the fleet key and peers, the admin passphrase, the admin SSH "
            "keys, the network settings, the provisioning bundle on the boot disk, the update's carried copy of "
            "all of these, the prompts kept in the prefix cache, per-key usage and the logs' contents. "
            "Models and the system stay.")


def _remove(path: Path) -> bool:
    """Remove a file, link or directory tree without following links; True if something was there."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return False
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)  # fd-based on Linux: a link planted inside is removed, never followed
    else:
        path.unlink()
    return True


def _entries(directory: Path) -> list[Path]:
    """A directory's entries; none when it is missing or is a link (never followed)."""
    try:
        return sorted(directory.iterdir()) if not directory.is_symlink() else []
    except FileNotFoundError:
        return []


def _empty(directory: Path, keep: set[Path] = frozenset()) -> list[Path]:
    return [entry for entry in _entries(directory) if entry not in keep and _remove(entry)]


def _truncate(directory: Path) -> list[Path]:
    done = []
    for entry in _entries(directory):
        try:
            fd = os.open(entry, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue  # a link, a directory, a fifo: not a log file
        try:
            if stat.S_ISREG(os.fstat(fd).st_mode):
                os.ftruncate(fd, 0)
                done.append(entry)
        finally:
            os.close(fd)
    return done


def factory_reset(root: Path, bundle_dir: Path) -> list[str]:
    """Erase the owner's set-up (see the module's docstring); returns what was there and is now gone or emptied.
    The API then refuses every request (an empty key file the services can read) until the wizard runs again."""
    root = Path(root)
    gone: list[Path] = []
    for rel in ERASED:
        if _remove(root / rel):
            gone.append(root / rel)
    for pattern in ERASED_GLOBS:
        for path in sorted(root.glob(pattern)):
            if _remove(path):
                gone.append(path)
    kept = {root / rel for rel in IMAGE_OWNED} | {root / rel for rel in EMPTIED}
    for rel in EMPTIED:
        gone += _empty(root / rel, keep=kept)
    for rel in TRUNCATED:
        gone += _truncate(root / rel)
    gone += _empty(Path(bundle_dir))  # the bundle first boot would apply again, and the presence token
    keys = root / KEYS_FILE
    # Readable by serving: a file it cannot read would leave it on the old keys.
    atomic_write(keys, b'{"version": 1, "keys": []}\n', 0o600, owner=service_owner())
    shown = []
    for path in gone:
        try:
            shown.append(str(path.relative_to(root)))
        except ValueError:
            shown.append(str(path))
    return shown
