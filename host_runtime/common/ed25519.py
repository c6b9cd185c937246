"""Ed25519 detached signatures (cryptography), hex-encoded: provisioning bundles and update releases alike."""

from __future__ import annotations

from host_runtime.common.errors import InputError


class BadSignature(InputError):
    """The signature does not verify with the key, or is not a signature at all."""


def sign(message: bytes, private_key_pem: bytes) -> str:
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    # Ed25519 is deterministic: one key and one message always give the same signature (reproducible builds).
    return load_pem_private_key(private_key_pem, password=None).sign(message).hex()


def verify(message: bytes, signature_hex: str, public_key_pem: bytes) -> None:
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    try:
        load_pem_public_key(public_key_pem).verify(bytes.fromhex(signature_hex.strip()), message)
    except (InvalidSignature, ValueError, TypeError):
        raise BadSignature() from None
