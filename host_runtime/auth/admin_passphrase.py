"""The box's admin passphrase, set in the first-boot wizard: what reopens the wizard on a provisioned box.

Stored as scrypt (hashlib, no extra dependency), 0600 root, under the provisioned root."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from pathlib import Path

from host_runtime.common.atomic_file import atomic_write

PASSPHRASE_FILE = "etc/everycycle/admin.passphrase"
MIN_LENGTH = 8
_N, _R, _P = 2**14, 8, 1


def hash_passphrase(passphrase: str) -> str:
    salt = secrets.token_bytes(16)
    digest = hashlib.scrypt(passphrase.encode(), salt=salt, n=_N, r=_R, p=_P, dklen=32)
    return f"scrypt${_N}${_R}${_P}${salt.hex()}${digest.hex()}"


def matches(stored: str, passphrase: str) -> bool:
    try:
        kind, n, r, p, salt, digest = stored.strip().split("$")
        if kind != "scrypt":
            return False
        got = hashlib.scrypt(passphrase.encode(), salt=bytes.fromhex(salt), n=int(n), r=int(r), p=int(p),
                             dklen=len(bytes.fromhex(digest)))
    except (ValueError, TypeError):
        return False
    return hmac.compare_digest(got, bytes.fromhex(digest))


def problem(passphrase: str, again: str) -> str | None:
    """Why a new passphrase cannot be used, or None."""
    if len(passphrase) < MIN_LENGTH:
        return f"the admin passphrase needs at least {MIN_LENGTH} characters"
    if passphrase != again:
        return "the two admin passphrases differ"
    return None


def stored(root: Path) -> str | None:
    try:
        return (Path(root) / PASSPHRASE_FILE).read_text()
    except OSError:
        return None


def save(root: Path, passphrase: str) -> None:
    atomic_write(Path(root) / PASSPHRASE_FILE, hash_passphrase(passphrase).encode() + b"\n", 0o600)


def check(root: Path, passphrase: str) -> bool:
    value = stored(root)
    return value is not None and matches(value, passphrase)


# What a factory reset removes, relative to the provisioned root: the box's identity, keys and settings. The
# model store, logs and the image itself stay.
FACTORY_RESET_ERASES = (
    "var/lib/everycycle/provisioned.json",
    "etc/everycycle/box.toml",
    "etc/everycycle/api_keys.json",
    "etc/everycycle/front.toml",
    "etc/everycycle/serving.toml",
    "etc/everycycle/governor.toml",
    "etc/everycycle/governor.env",
    "etc/everycycle/bmc.toml",
    "etc/everycycle/bmc.password",
    "etc/everycycle/tls/api.crt",
    "etc/everycycle/tls/api.key",
    "etc/everycycle/tls/self-signed.crt",
    "etc/everycycle/tls/self-signed.key",
    PASSPHRASE_FILE,
    "root/.ssh/authorized_keys",
)
FACTORY_RESET_GLOBS = ("etc/systemd/network/10-everycycle-*.network",)


def factory_reset(root: Path) -> list[str]:
    """Erase the box's set-up (see FACTORY_RESET_ERASES); returns what was there and is now gone. The API then
    refuses every request (no keys) until the wizard runs again."""
    root = Path(root)
    gone = []
    targets = [root / rel for rel in FACTORY_RESET_ERASES]
    for pattern in FACTORY_RESET_GLOBS:
        targets += sorted(root.glob(pattern))
    for path in targets:
        if path.is_symlink() or path.exists():
            path.unlink()
            gone.append(str(path.relative_to(root)))
    keys = root / "etc/everycycle/api_keys.json"
    atomic_write(keys, b'{"version": 1, "keys": []}\n', 0o600)
    return gone


def describe_reset() -> str:
    return ("Factory reset erases: this box's API keys, its box.toml and service settings, the TLS certificate "
            "and key, the BMC password, the admin passphrase, the admin SSH keys and the network settings. "
            "Models, logs and the system stay.")

