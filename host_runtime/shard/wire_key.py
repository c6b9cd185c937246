"""The secret each member's RPC wire is keyed with, derived from the fleet key and the member's address (pure).

stunnel's TLS with a pre-shared key: both ends prove they hold it, the wire is encrypted, and no certificate
has to be issued, renewed or trusted. Derived rather than the fleet key itself (which is also the gateway's bearer
credential at every box's API), and per member: a member needs only its own, which opens no other member's wire,
while the holder, which has the fleet key, derives each member's.
"""

from __future__ import annotations

import hashlib
import re

from host_runtime.common.host_port import split_host_port

_DERIVATION = b"everycycle shard wire v1\0"


def check_member_address(text: str) -> None:
    """ValueError where `text` is not an ADDR:PORT a member can be named by: the address holders reach it by,
    since its wire key is derived from it (so never 0.0.0.0 or ::)."""
    host, _ = split_host_port(text)
    if host.is_unspecified:
        raise ValueError(f"name the address holders reach the box by, not {text}: the wire's key is derived from it")


def psk_identity(member: str) -> str:
    """The TLS identity a member's key goes by: its ADDR:PORT, in characters stunnel's secrets file keeps."""
    return "everycycle-shard-" + re.sub(r"[^0-9A-Za-z.]", "-", member)


def wire_psk(fleet_key: str, member: str) -> str:
    """Member's pre-shared key, as 64 hex digits (stunnel takes 16 to 256 printable characters)."""
    return hashlib.sha256(_DERIVATION + member.encode() + b"\0" + fleet_key.strip().encode()).hexdigest()


def secrets_text(fleet_key: str, members: list[str]) -> str:
    """stunnel's PSKsecrets file, IDENTITY:KEY a line: a member's own alone, the holder's one for each member."""
    return "".join(f"{psk_identity(m)}:{wire_psk(fleet_key, m)}\n" for m in members)


def _key_lines(text: str) -> dict[str, str]:
    """IDENTITY:KEY lines, as `fleet shard-key` prints them, by identity; ValueError saying what is wrong."""
    keys = {}
    for line in (line.strip() for line in text.splitlines()):
        if not line:
            continue
        identity, sep, key = line.partition(":")
        if not sep:
            raise ValueError("is not IDENTITY:KEY lines (from everycycle fleet shard-key)")
        if len(key) != 64 or any(c not in "0123456789abcdef" for c in key):
            raise ValueError("holds no key of the form fleet shard-key writes")
        keys[identity] = key
    return keys


def own_secret(text: str, member: str) -> str:
    """A member's own secrets file (what `fleet shard-key` printed for it), checked to be for `member`; ValueError
    saying what is wrong."""
    keys = _key_lines(text)
    if len(keys) != 1:
        raise ValueError("is not one IDENTITY:KEY line (from everycycle fleet shard-key)")
    identity = next(iter(keys))
    if identity != psk_identity(member):
        raise ValueError(f"is the key of another address ({identity}), not of {member}")
    return f"{identity}:{keys[identity]}\n"


def holder_secrets(text: str, members: list[str]) -> str:
    """The holder's secrets file for `members` from its key file's text: the fleet key (each member's derived
    here), or the members' own keys as `fleet shard-key --member A --member B` prints them, so that a holder
    need not keep the fleet key (a provisioned one does not). ValueError saying what is wrong."""
    words = text.split()
    if len(words) == 1 and ":" not in words[0]:
        return secrets_text(words[0], members)
    keys = _key_lines(text)
    missing = [m for m in members if psk_identity(m) not in keys]
    if missing:
        raise ValueError(f"holds no wire key for {', '.join(missing)} (everycycle fleet shard-key --member ADDR:PORT)")
    return "".join(f"{psk_identity(m)}:{keys[psk_identity(m)]}\n" for m in members)
