"""Bundle signatures: Ed25519 (cryptography) over a manifest of box.toml and every declared file's hash."""

from __future__ import annotations

import hashlib

from provisioning.bundle import Bundle, BundleError

SIGNATURE_FILE = "bundle.sig"


def manifest(bundle: Bundle) -> bytes:
    lines = [b"everycycle-bundle-1", hashlib.sha256(bundle.raw_toml).hexdigest().encode()]
    files = bundle.box.get("files") or {}
    if not isinstance(files, dict):
        raise BundleError("files", "must be a table of file = sha256")
    for rel, digest in sorted(files.items()):
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

    try:
        signature = bundle.read(SIGNATURE_FILE, 4096)
    except BundleError:
        raise BundleError(SIGNATURE_FILE, "this box requires signed bundles and this one is not signed") from None
    try:
        _public_key(public_key_pem).verify(bytes.fromhex(signature.decode("ascii").strip()), manifest(bundle))
    except (InvalidSignature, ValueError, UnicodeDecodeError):
        raise BundleError(SIGNATURE_FILE, "the signature does not match: the bundle was altered or signed by "
                                          "another key") from None
