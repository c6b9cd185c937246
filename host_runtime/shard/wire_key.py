"""The secret the RPC wire's TLS is keyed with, derived from the fleet key (pure).

stunnel's TLS with a pre-shared key: both ends prove they hold it, the wire is encrypted, and no certificate
has to be issued, renewed or trusted. Derived rather than the fleet key itself: the fleet key is also the
gateway's bearer credential at every box's API, and the secrets file stunnel reads should open nothing but the
wire.
"""

from __future__ import annotations

import hashlib

PSK_IDENTITY = "everycycle-shard"
_DERIVATION = b"everycycle shard wire v1\0"


def wire_psk(fleet_key: str) -> str:
    """The pre-shared key, as 64 hex digits (stunnel takes 16 to 256 printable characters)."""
    return hashlib.sha256(_DERIVATION + fleet_key.strip().encode()).hexdigest()


def secrets_text(fleet_key: str) -> str:
    """stunnel's PSKsecrets file: IDENTITY:KEY."""
    return f"{PSK_IDENTITY}:{wire_psk(fleet_key)}\n"
