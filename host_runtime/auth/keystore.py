"""API keys: generated once, shown once, stored only as SHA-256 hashes in a 0600 file.

Keys are 256-bit random tokens, so a plain SHA-256 is enough to make the file
useless to a reader (no dictionary to attack); comparisons are constant-time.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import stat
import time
from dataclasses import dataclass, replace
from pathlib import Path

from host_runtime.common.atomic_file import atomic_write

KEY_PREFIX = "ec-"
FILE_VERSION = 1


class KeyStoreError(Exception):
    """The key file is missing, unreadable, malformed or unsafe."""


# A key's priority class (engine/wire.PRIORITIES): its requests' place in the engine's queue. A request may ask for
# a lower class than its key's (a batch job says "batch"), never a higher one.
PRIORITIES = ("interactive", "default", "batch")


@dataclass(frozen=True)
class StoredKey:
    name: str
    sha256: str
    hint: str
    created: float
    priority: str = "default"
    max_concurrent: int = 0  # its requests running or waiting at once, at most (0: no limit); the engine counts


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def key_hint(key: str) -> str:
    """What may be shown after creation: enough to tell keys apart, useless to an attacker."""
    return f"{key[:len(KEY_PREFIX) + 4]}…{key[-4:]}"


def load_keys(path: str | os.PathLike) -> list[StoredKey]:
    p = Path(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise KeyStoreError(f"cannot read key file {p}: {exc.strerror}") from exc
    try:
        doc = json.loads(raw)
        if doc.get("version") != FILE_VERSION or not isinstance(doc.get("keys"), list):
            raise ValueError("expected {'version': 1, 'keys': [...]}")
        keys = [StoredKey(str(k["name"]), str(k["sha256"]), str(k.get("hint", "")), float(k.get("created", 0)),
                          str(k.get("priority", "default")), int(k.get("max_concurrent", 0))) for k in doc["keys"]]
        for k in keys:
            if k.priority not in PRIORITIES:
                raise ValueError(f"key {k.name!r}: priority must be one of {', '.join(PRIORITIES)}")
            if k.max_concurrent < 0:
                raise ValueError(f"key {k.name!r}: max_concurrent must be 0 (no limit) or more")
        return keys
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise KeyStoreError(f"key file {p} is malformed: {exc}") from exc


def check_permissions(path: str | os.PathLike) -> None:
    """Refuse a key file that others can read or write: hashes are secrets too."""
    st = os.stat(path)
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise KeyStoreError(
            f"key file {path} has mode {stat.S_IMODE(st.st_mode):04o}; it must be 0600 (chmod 600 {path})"
        )


def _save(path: str | os.PathLike, keys: list[StoredKey]) -> None:
    doc = {"version": FILE_VERSION, "keys": [k.__dict__ for k in keys]}
    atomic_write(path, (json.dumps(doc, indent=2) + "\n").encode(), mode=0o600)


def revoke_key(path: str | os.PathLike, name: str) -> bool:
    """Remove the key named `name`; False if there was none."""
    keys = load_keys(path)
    kept = [k for k in keys if k.name != name]
    if len(kept) == len(keys):
        return False
    _save(path, kept)
    return True


def _key_name(name: str) -> str:
    name = name.strip()
    if not name:
        raise KeyStoreError("NAME must not be empty")
    return name


def _put(path: str | os.PathLike, keys: list[StoredKey], name: str, key: str, priority: str | None = None) -> None:
    """Save `keys` with `key`'s hash under `name`, in place of any key of that name (keeping its priority unless
    one is given)."""
    old = next((k for k in keys if k.name == name), None)
    priority = priority or (old.priority if old else "default")
    _save(path, [k for k in keys if k.name != name] + [StoredKey(name, hash_key(key), key_hint(key), time.time(),
                                                                  priority, old.max_concurrent if old else 0)])


def _priority(priority: str) -> str:
    if priority not in PRIORITIES:
        raise KeyStoreError(f"--priority must be one of {', '.join(PRIORITIES)}, got {priority!r}")
    return priority


def _change(path: str | os.PathLike, name: str, **changes) -> None:
    keys = load_keys(path)
    if not any(k.name == name for k in keys):
        raise KeyStoreError(f"no key named {name!r} in {path}")
    _save(path, [replace(k, **changes) if k.name == name else k for k in keys])


def set_priority(path: str | os.PathLike, name: str, priority: str) -> None:
    """Change the priority class of the key named `name` (KeyStoreError if there is none)."""
    _change(path, name, priority=_priority(priority))


def set_limit(path: str | os.PathLike, name: str, max_concurrent: int) -> None:
    """Change how many requests the key named `name` may have running or waiting at once (0: no limit)."""
    if max_concurrent < 0:
        raise KeyStoreError(f"--max-concurrent must be 0 (no limit) or more, got {max_concurrent}")
    _change(path, name, max_concurrent=max_concurrent)


def create_key(path: str | os.PathLike, name: str, priority: str = "default") -> str:
    """Add a new key named `name` to the file at `path` and return it (the only time it exists in clear)."""
    name = _key_name(name)
    priority = _priority(priority)
    keys = load_keys(path)
    if any(k.name == name for k in keys):
        raise KeyStoreError(f"a key named {name!r} already exists in {path}")
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    _put(path, keys, name, key, priority)
    return key


def store_key(path: str | os.PathLike, name: str, key: str) -> None:
    """Store the hash of a key made elsewhere (the fleet key) under `name`, replacing a key of that name."""
    _put(path, load_keys(path), _key_name(name), key)


class KeyVerifier:
    """Checks bearer tokens against the key file, re-reading it when it changes on disk."""

    def __init__(self, path: str | os.PathLike):
        self._path = Path(path)
        self._stamp: tuple[int, int] | None = None
        self._hashes: dict[str, str] = {}
        self._policies: dict[str, StoredKey] = {}
        self._reload_if_changed()

    def _reload_if_changed(self) -> None:
        try:
            st = self._path.stat()
        except FileNotFoundError:
            self._stamp, self._hashes, self._policies = None, {}, {}
            return
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp != self._stamp:
            check_permissions(self._path)
            keys = load_keys(self._path)
            self._hashes = {k.sha256: k.name for k in keys}
            self._policies = {k.name: k for k in keys}
            self._stamp = stamp

    def verify(self, token: str) -> str | None:
        """The key's name if `token` is a valid key, else None."""
        try:
            self._reload_if_changed()
        except KeyStoreError:
            # Keep serving with the last good set rather than locking everyone out.
            pass
        digest = hash_key(token)
        for stored, name in self._hashes.items():
            if hmac.compare_digest(stored, digest):
                return name
        return None

    def priority_of(self, name: str) -> str:
        """The priority class of the key named `name` (as of the last verify)."""
        policy = self._policies.get(name)
        return policy.priority if policy else "default"

    def max_concurrent_of(self, name: str) -> int:
        """How many requests the key named `name` may have at once (0: no limit; as of the last verify)."""
        policy = self._policies.get(name)
        return policy.max_concurrent if policy else 0
