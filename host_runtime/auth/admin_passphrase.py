"""The box's admin passphrase, set in the first-boot wizard: what reopens the wizard on a provisioned box.

Stored as scrypt (hashlib, no extra dependency), 0600 root, under the provisioned root."""

from __future__ import annotations

import hashlib
import hmac
import json
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


# Wrong passphrases, counted on disk: the console restarts (and a BMC's remote console reconnects), so a count kept
# in memory gave every restart three fresh tries.
LOCKOUT_FILE = "var/lib/everycycle/console-lockout.json"
TRIES = 3
LOCKOUT_S = 60.0


def locked_for(root: Path, now: float) -> float:
    """Seconds until the passphrase may be tried again (0: it may be now)."""
    try:
        until = float(json.loads((Path(root) / LOCKOUT_FILE).read_text()).get("locked_until", 0))
    except (OSError, ValueError, TypeError, AttributeError):
        return 0.0
    return max(0.0, until - now)


def attempt(root: Path, passphrase: str, now: float) -> bool:
    """Check a passphrase, counting a wrong one on disk: the third wrong one in a row locks it for a minute.
    False while locked, whatever was typed."""
    path = Path(root) / LOCKOUT_FILE
    if locked_for(root, now):
        return False
    if check(root, passphrase):
        path.unlink(missing_ok=True)
        return True
    try:
        wrong = int(json.loads(path.read_text()).get("wrong", 0))
    except (OSError, ValueError, TypeError, AttributeError):
        wrong = 0
    wrong += 1
    state = {"wrong": 0, "locked_until": now + LOCKOUT_S} if wrong >= TRIES else {"wrong": wrong, "locked_until": 0}
    atomic_write(path, json.dumps(state).encode() + b"\n", 0o600)
    return False
