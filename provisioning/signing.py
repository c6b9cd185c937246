"""Bundle signatures: Ed25519 (cryptography) over a manifest of box.toml and every declared file's hash."""

from __future__ import annotations

import hashlib

from host_runtime.common import ed25519
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


def sign(bundle: Bundle, private_key_pem: bytes) -> None:
    (bundle.root / SIGNATURE_FILE).write_text(ed25519.sign(manifest(bundle), private_key_pem) + "\n")


def verify(bundle: Bundle, public_key_pem: bytes) -> None:
    try:
        signature = bundle.read(SIGNATURE_FILE, 4096)
    except BundleError:
        raise BundleError(SIGNATURE_FILE, "this box requires signed bundles and this one is not signed") from None
    try:
        ed25519.verify(manifest(bundle), signature.decode("ascii"), public_key_pem)
    except (ed25519.BadSignature, UnicodeDecodeError):
        raise BundleError(SIGNATURE_FILE, "the signature does not match: the bundle was altered or signed by "
                                          "another key") from None
