"""Bundle signatures: Ed25519 (cryptography) over a manifest of box.toml and every declared file's hash."""

from __future__ import annotations

import hashlib

from provisioning.bundle import Bundle, BundleError

SIGNATURE_FILE = "bundle.sig"


def manifest(bundle: Bundle) -> bytes:
    lines = [b"everycycle-bundle-1", hashlib.sha256(bundle.raw_toml).hexdigest().encode()]
    for rel, digest in sorted((bundle.box.get("files") or {}).items()):
        lines.append(f"{rel} {digest}".encode())
    return b"\n".join(lines) + b"\n"


def _private_key(pem: bytes):
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    return load_pem_private_key(pem, password=None)


def _public_key(pem: bytes):
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    return load_pem_public_key(pem)


def sign(bundle: Bundle, private_key_pem: bytes) -> None:
    signature = _private_key(private_key_pem).sign(manifest(bundle))
    (bundle.root / SIGNATURE_FILE).write_text(signature.hex() + "\n")


def verify(bundle: Bundle, public_key_pem: bytes) -> None:
    from cryptography.exceptions import InvalidSignature

    path = bundle.root / SIGNATURE_FILE
    if not path.exists():
        raise BundleError(SIGNATURE_FILE, "this box requires signed bundles and this one is not signed")
    try:
        _public_key(public_key_pem).verify(bytes.fromhex(path.read_text().strip()), manifest(bundle))
    except (InvalidSignature, ValueError):
        raise BundleError(SIGNATURE_FILE, "the signature does not match: the bundle was altered or signed by "
                                          "another key") from None
