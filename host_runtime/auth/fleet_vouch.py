"""The fleet's gateway vouches for a client's key to the box that serves the request (#56, item 6).

The gateway's front asks its own API whether the client's key is valid (nginx auth_request, which sees no body),
then sglang-router sends the request to a box. The box never sees the client's key; it used to see the fleet key
alone, so none of the client key's limits held there. Now the API's answer carries a voucher, the front sends it
to the router as the request's bearer token, and the router (its workers registered without a key of their own)
passes it on: the box checks the signature and applies the key's models, token limits, concurrency and class as
if the key were its own, under the name KEY@fleet (its own ledger, prefix-cache scope and usage rows).

Signed with Ed25519 under a key derived from the fleet key: every box of the fleet stores the public half when it
imports the fleet key, the gateway alone the private half (the seed), so a member's key file opens no other box,
as with the fleet key's hash. A voucher lives VOUCH_LIFETIME_S (a request that waits in the router's retries
still arrives within it; clocks may differ by CLOCK_SKEW_S); it travels only over loopback and TLS between boxes.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass, field

PREFIX = "ecv1."               # a voucher's bearer token starts so; an API key never does (keystore.KEY_PREFIX)
VOUCH_HEADER = "X-EveryCycle-Vouch"   # the gateway API's answer to the front's key check carries it
VOUCHED_SUFFIX = "@fleet"            # a vouched key's name on the box that serves it: KEY@fleet
# A box refuses a vouched request for its key's limits with this status, not 429: sglang-router retries a 429 on
# every box (8 tries, 13 s measured) and would find one where a per-box count has room. The gateway's front turns
# it back into the 429 the box meant, with its Retry-After and the error body carried in ERROR_HEADER.
VOUCHED_LIMIT_STATUS = 430
ERROR_HEADER = "X-EveryCycle-Error"
VOUCH_LIFETIME_S = 600
CLOCK_SKEW_S = 120
_DERIVATION = b"everycycle fleet voucher v1\0"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def signing_seed(fleet_key: str) -> str:
    """The gateway's private half, from the fleet key (base64)."""
    return _b64(hashlib.sha256(_DERIVATION + fleet_key.encode()).digest())


def public_key(fleet_key: str) -> str:
    """What every box keeps to check vouchers (base64 of the raw Ed25519 public key)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    private = Ed25519PrivateKey.from_private_bytes(_unb64(signing_seed(fleet_key)))
    return _b64(private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw))


@dataclass(frozen=True)
class Vouch:
    """What the gateway says of the client's key: its name and limits (keystore.StoredKey's)."""
    key: str                       # the client key's name at the gateway ("": the gateway takes no keys)
    priority: str = "default"
    max_concurrent: int = 0
    tokens_per_minute: int = 0
    tokens_per_day: int = 0
    models: tuple[str, ...] = ()
    # What the key used in the last minute and day on each box, as the gateway last polled them ({box's use id:
    # [minute, day]}): a box adds the others' to its own, so token limits hold across the fleet, not per box.
    fleet_use: dict[str, list[int]] = field(default_factory=dict)

    def elsewhere(self, own_use_id: str) -> tuple[int, int]:
        """The key's minute and day use on the fleet's other boxes."""
        others = [use for box, use in self.fleet_use.items() if box != own_use_id]
        return sum(u[0] for u in others), sum(u[1] for u in others)


class Voucher:
    """The gateway's side: issues vouchers with the seed."""

    def __init__(self, seed: str):
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        self._private = Ed25519PrivateKey.from_private_bytes(_unb64(seed))

    def issue(self, vouch: Vouch, now: float) -> str:
        claims = {"key": vouch.key, "priority": vouch.priority, "max_concurrent": vouch.max_concurrent,
                  "tokens_per_minute": vouch.tokens_per_minute, "tokens_per_day": vouch.tokens_per_day,
                  "models": list(vouch.models), "fleet_use": vouch.fleet_use, "iat": int(now),
                  "exp": int(now) + VOUCH_LIFETIME_S}
        body = PREFIX + _b64(json.dumps(claims, separators=(",", ":")).encode())
        return body + "." + _b64(self._private.sign(body.encode()))


def check(token: str, public: str, now: float) -> Vouch | None:
    """The voucher's claims where `public` verifies its signature and it is current; else None."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    if not token.startswith(PREFIX):
        return None
    body, _, signature = token.rpartition(".")
    try:
        Ed25519PublicKey.from_public_bytes(_unb64(public)).verify(_unb64(signature), body.encode())
        claims = json.loads(_unb64(body[len(PREFIX):]))
        if not int(claims["iat"]) - CLOCK_SKEW_S <= now <= int(claims["exp"]) + CLOCK_SKEW_S:
            return None
        return Vouch(str(claims["key"]), str(claims["priority"]), int(claims["max_concurrent"]),
                     int(claims["tokens_per_minute"]), int(claims["tokens_per_day"]),
                     tuple(str(m) for m in claims["models"]),
                     {str(box): [int(use[0]), int(use[1])] for box, use in claims.get("fleet_use", {}).items()})
    except (InvalidSignature, ValueError, TypeError, KeyError):
        return None
