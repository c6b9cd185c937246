"""The secret each member's RPC wire is keyed with, derived from the fleet key and the member's address (pure).

stunnel's TLS with a pre-shared key: both ends prove they hold it, the wire is encrypted, and no certificate
has to be issued, renewed or trusted. Derived rather than the fleet key itself (which is also the gateway's bearer
credential at every box's API), and per member: a member needs only its own, which opens no other member's wire,
while the holder, which has the fleet key, derives each member's.
"""

from __future__ import annotations

import hashlib
import re

_DERIVATION = b"everycycle shard wire v1\0"


def psk_identity(member: str) -> str:
    """The TLS identity a member's key goes by: its ADDR:PORT, in characters stunnel's secrets file keeps."""
    return "everycycle-shard-" + re.sub(r"[^0-9A-Za-z.]", "-", member)


def wire_psk(fleet_key: str, member: str) -> str:
    """Member's pre-shared key, as 64 hex digits (stunnel takes 16 to 256 printable characters)."""
    return hashlib.sha256(_DERIVATION + member.encode() + b"\0" + fleet_key.strip().encode()).hexdigest()


def secrets_text(fleet_key: str, members: list[str]) -> str:
    """stunnel's PSKsecrets file, IDENTITY:KEY a line: a member's own alone, the holder's one for each member."""
    return "".join(f"{psk_identity(m)}:{wire_psk(fleet_key, m)}\n" for m in members)


def own_secret(text: str, member: str) -> str:
    """A member's own secrets file (what `fleet shard-key` printed for it), checked to be for `member`; ValueError
    saying what is wrong."""
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) != 1 or ":" not in lines[0]:
        raise ValueError("is not one IDENTITY:KEY line (from everycycle fleet shard-key)")
    identity, key = lines[0].split(":", 1)
    if identity != psk_identity(member):
        raise ValueError(f"is the key of another address ({identity}), not of {member}")
    if len(key) != 64 or any(c not in "0123456789abcdef" for c in key):
        raise ValueError("holds no key of the form fleet shard-key writes")
    return lines[0] + "\n"
