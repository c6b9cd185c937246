"""API keys: generated once, shown once, stored only as SHA-256 hashes in a 0600 file.

Keys are 256-bit random tokens, so a plain SHA-256 is enough to make the file
useless to a reader (no dictionary to attack); comparisons are constant-time.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import os
import secrets
import stat
import time
from dataclasses import dataclass, replace
from pathlib import Path

from host_runtime.auth import fleet_vouch
from host_runtime.common.errors import EveryCycleError
from host_runtime.common.atomic_file import atomic_write
from host_runtime.common.file_lock import updating
from host_runtime.engine.wire import PRIORITIES

KEY_PREFIX = "ec-"
FILE_VERSION = 1


class KeyStoreError(EveryCycleError):
    """The key file is missing, unreadable, malformed or unsafe."""


# A key's priority class (engine/wire.PRIORITIES): its requests' place in the engine's queue. A request may ask for
# a lower class than its key's (a batch job says "batch"), never a higher one.


@dataclass(frozen=True)
class StoredKey:
    name: str
    sha256: str
    hint: str
    created: float
    priority: str = "default"
    max_concurrent: int = 0  # its requests running or waiting at once, at most (0: no limit); the engine counts
    tokens_per_minute: int = 0  # prompt and generated tokens in any minute, at most (0: no limit); the engine counts
    tokens_per_day: int = 0     # the same in any 24 hours
    models: tuple[str, ...] = ()  # the models (or aliases) it may ask for; empty: every one
    # The addresses (IPs or networks) it is valid from; empty: any. The fleet key on a member: the gateway's.
    allowed_from: tuple[str, ...] = ()
    # It may change the box's models through the API (/api/pull): what every key's requests may then be served by
    # (a pulled model named like an alias the owner set took that name's requests over). The owner's grant alone.
    may_pull: bool = False
    # The fleet key's record (auth/fleet_vouch.py): the public key that checks the gateway's vouchers for clients'
    # keys, and on the gateway alone the seed that signs them.
    vouch_public_key: str = ""
    vouch_signing_seed: str = ""

    def allows_address(self, address: str | None) -> bool:
        """Whether a request from `address` (None: unknown) may use this key."""
        if not self.allowed_from:
            return True
        try:
            ip = ipaddress.ip_address((address or "").split("%", 1)[0])
        except ValueError:
            return False
        if ip.version == 6 and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        return any(ip in ipaddress.ip_network(net, strict=False) for net in self.allowed_from)


def check_addresses(values) -> tuple[str, ...]:
    """Addresses or networks as given (ValueError naming the bad one)."""
    out = []
    for value in values:
        try:
            ipaddress.ip_network(str(value), strict=False)
        except ValueError:
            raise ValueError(f"{value!r} is not an IP address or network") from None
        out.append(str(value))
    return tuple(out)


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
                          str(k.get("priority", "default")), int(k.get("max_concurrent", 0)),
                          int(k.get("tokens_per_minute", 0)), int(k.get("tokens_per_day", 0)),
                          tuple(str(m) for m in k.get("models", ())),
                          check_addresses(k.get("allowed_from", ())), _flag(k, "may_pull"),
                          str(k.get("vouch_public_key", "")), str(k.get("vouch_signing_seed", "")))
                for k in doc["keys"]]
        for k in keys:
            if k.priority not in PRIORITIES:
                raise ValueError(f"key {k.name!r}: priority must be one of {', '.join(PRIORITIES)}")
            for limit in ("max_concurrent", "tokens_per_minute", "tokens_per_day"):
                if getattr(k, limit) < 0:
                    raise ValueError(f"key {k.name!r}: {limit} must be 0 (no limit) or more")
        return keys
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise KeyStoreError(f"key file {p} is malformed: {exc}") from exc


def _flag(entry: dict, name: str) -> bool:
    value = entry.get(name, False)
    if not isinstance(value, bool):
        raise ValueError(f"key {entry.get('name')!r}: {name} must be true or false")
    return value


def check_permissions(path: str | os.PathLike) -> None:
    """Refuse a key file that others can read or write: hashes are secrets too."""
    st = os.stat(path)
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise KeyStoreError(
            f"key file {path} has mode {stat.S_IMODE(st.st_mode):04o}; it must be 0600 (chmod 600 {path})"
        )


def _save(path: str | os.PathLike, keys: list[StoredKey]) -> None:
    doc = {"version": FILE_VERSION, "keys": [{**k.__dict__, "models": list(k.models),
                                              "allowed_from": list(k.allowed_from)} for k in keys]}
    atomic_write(path, (json.dumps(doc, indent=2) + "\n").encode(), mode=0o600)


def revoke_key(path: str | os.PathLike, name: str) -> bool:
    """Remove the key named `name`; False if there was none."""
    with updating(path):
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


def _put(path: str | os.PathLike, keys: list[StoredKey], name: str, key: str, priority: str | None = None,
         vouch: dict | None = None) -> None:
    """Save `keys` with `key`'s hash under `name`, in place of any key of that name (keeping its priority unless
    one is given)."""
    old = next((k for k in keys if k.name == name), None)
    priority = priority or (old.priority if old else "default")
    limits = {"max_concurrent": old.max_concurrent, "tokens_per_minute": old.tokens_per_minute,
              "tokens_per_day": old.tokens_per_day, "models": old.models, "allowed_from": old.allowed_from,
              "may_pull": old.may_pull} if old else {}
    _save(path, [k for k in keys if k.name != name] + [StoredKey(name, hash_key(key), key_hint(key), time.time(),
                                                                  priority, **limits, **(vouch or {}))])


def _priority(priority: str) -> str:
    if priority not in PRIORITIES:
        raise KeyStoreError(f"--priority must be one of {', '.join(PRIORITIES)}, got {priority!r}")
    return priority


def _change(path: str | os.PathLike, name: str, **changes) -> None:
    with updating(path):
        keys = load_keys(path)
        if not any(k.name == name for k in keys):
            raise KeyStoreError(f"no key named {name!r} in {path}")
        _save(path, [replace(k, **changes) if k.name == name else k for k in keys])


def set_priority(path: str | os.PathLike, name: str, priority: str) -> None:
    """Change the priority class of the key named `name` (KeyStoreError if there is none)."""
    _change(path, name, priority=_priority(priority))


def set_limit(path: str | os.PathLike, name: str, max_concurrent: int | None = None,
              tokens_per_minute: int | None = None, tokens_per_day: int | None = None,
              models: tuple[str, ...] | None = None, allowed_from: tuple[str, ...] | None = None,
              may_pull: bool | None = None) -> None:
    """Change the limits of the key named `name` that are given (None: kept; 0 or (): no limit): requests at once,
    tokens a minute and a day, the models it may ask for, the addresses it is valid from, and whether it may
    change the box's models."""
    changes = {}
    for option, value in (("max-concurrent", max_concurrent), ("tokens-per-minute", tokens_per_minute),
                          ("tokens-per-day", tokens_per_day)):
        if value is not None:
            if value < 0:
                raise KeyStoreError(f"--{option} must be 0 (no limit) or more, got {value}")
            changes[option.replace("-", "_")] = value
    if models is not None:
        changes["models"] = tuple(m for m in models if m)
    if allowed_from is not None:
        try:
            changes["allowed_from"] = check_addresses(a for a in allowed_from if a)
        except ValueError as exc:
            raise KeyStoreError(f"--from: {exc}") from None
    if may_pull is not None:
        changes["may_pull"] = may_pull
    if not changes:
        raise KeyStoreError("give at least one limit: --max-concurrent, --tokens-per-minute, --tokens-per-day, "
                            "--models, --from or --may-pull")
    _change(path, name, **changes)


def create_key(path: str | os.PathLike, name: str, priority: str = "default") -> str:
    """Add a new key named `name` to the file at `path` and return it (the only time it exists in clear)."""
    name = _key_name(name)
    priority = _priority(priority)
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    with updating(path):
        keys = load_keys(path)
        if any(k.name == name for k in keys):
            raise KeyStoreError(f"a key named {name!r} already exists in {path}")
        _put(path, keys, name, key, priority)
    return key


def store_key(path: str | os.PathLike, name: str, key: str, gateway: bool = False) -> None:
    """Store the hash of a key made elsewhere (the fleet key) under `name`, replacing a key of that name, with
    the public key that checks vouchers made from it (and on the fleet's gateway the seed that makes them)."""
    name = _key_name(name)
    with updating(path):
        _put(path, load_keys(path), name, key, vouch=fleet_vouch_fields(key, gateway))


def fleet_vouch_fields(fleet_key: str, gateway: bool) -> dict:
    """The fleet key's record's voucher fields (auth/fleet_vouch.py): the public key on every box, the signing
    seed on the gateway alone."""
    fields = {"vouch_public_key": fleet_vouch.public_key(fleet_key)}
    if gateway:
        fields["vouch_signing_seed"] = fleet_vouch.signing_seed(fleet_key)
    return fields


class KeyVerifier:
    """Checks bearer tokens against the key file, re-reading it when it changes on disk."""

    def __init__(self, path: str | os.PathLike):
        self._path = Path(path)
        self._stamp: tuple[int, int] | None = None
        self._hashes: dict[str, str] = {}
        self._policies: dict[str, StoredKey] = {}
        self._voucher_seed, self._voucher = "", None
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

    def policy_of(self, name: str) -> StoredKey | None:
        """The key named `name`, with its limits (as of the last verify)."""
        return self._policies.get(name)

    def checks_vouchers(self) -> bool:
        """Whether a record can check the gateway's vouchers (the fleet key imported since they exist)."""
        try:
            self._reload_if_changed()
        except KeyStoreError:
            pass
        return any(k.vouch_public_key for k in self._policies.values())

    def voucher(self) -> "fleet_vouch.Voucher | None":
        """The gateway's voucher (a key record holds the signing seed), or None."""
        seed = next((k.vouch_signing_seed for k in self._policies.values() if k.vouch_signing_seed), "")
        if seed != self._voucher_seed:
            self._voucher_seed, self._voucher = seed, fleet_vouch.Voucher(seed) if seed else None
        return self._voucher

    def vouched(self, token: str, now: float) -> tuple[StoredKey, StoredKey, "fleet_vouch.Vouch"] | None:
        """For a gateway's voucher (fleet_vouch.PREFIX): (the fleet key's record, whose address rule applies; the
        client's key as vouched, named KEY@fleet, with its limits and class; the voucher's claims). None where no
        record's public key verifies it or it is out of date."""
        try:
            self._reload_if_changed()
        except KeyStoreError:
            pass
        for record in self._policies.values():
            if record.vouch_public_key:
                vouch = fleet_vouch.check(token, record.vouch_public_key, now)
                if vouch is not None:
                    name = vouch.key + fleet_vouch.VOUCHED_SUFFIX if vouch.key else record.name
                    return record, StoredKey(name, "", "vouched by the fleet's gateway", 0.0,
                                             vouch.priority if vouch.priority in PRIORITIES else "default",
                                             vouch.max_concurrent, vouch.tokens_per_minute, vouch.tokens_per_day,
                                             vouch.models, record.allowed_from), vouch
        return None

    def max_concurrent_of(self, name: str) -> int:
        """How many requests the key named `name` may have at once (0: no limit; as of the last verify)."""
        policy = self._policies.get(name)
        return policy.max_concurrent if policy else 0
