"""An update release: two files and their signed list.

  everycycle_<v>.root.raw.zst   the root slot's file system (zstd), written into the idle slot
  everycycle_<v>.efi            the unified kernel image, which boots that slot (root=PARTLABEL=ec_<v>)
  SHA256SUMS                    sha256sum's format, one line per file
  SHA256SUMS.sig                an Ed25519 signature over SHA256SUMS (hex), by the key the image trusts

Both sides use this module: image/update_artifacts.py writes a release, `everycycle update` checks one. The
signature is checked before anything else is read, and every hash before anything is written to a slot.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from host_runtime.common import ed25519
from host_runtime.update import versioning
from host_runtime.update.errors import UpdateError

SUMS = "SHA256SUMS"
# Staged on the box: the root image expanded from .zst, which systemd-sysupdate writes into the slot as it is
# (it copies a local file's bytes; only its url-file sources are decompressed).
ROOT_STAGED_SUFFIX = ".root.raw"
SIGNATURE = "SHA256SUMS.sig"
ROOT_SUFFIX = ".root.raw.zst"
UKI_SUFFIX = ".efi"
MAX_SUMS_BYTES = 64 << 10
MAX_SIGNATURE_BYTES = 4 << 10
_LINE = re.compile(r"([0-9a-f]{64}) [ *]([A-Za-z0-9][A-Za-z0-9._~^+-]*)")


@dataclass(frozen=True)
class Release:
    version: str
    sha256: dict[str, str]  # file name -> hex digest

    @property
    def root_file(self) -> str:
        return f"{versioning.UKI_PREFIX}{self.version}{ROOT_SUFFIX}"

    @property
    def root_staged_file(self) -> str:
        return f"{versioning.UKI_PREFIX}{self.version}{ROOT_STAGED_SUFFIX}"

    @property
    def uki_file(self) -> str:
        return f"{versioning.UKI_PREFIX}{self.version}{UKI_SUFFIX}"

    @property
    def files(self) -> tuple[str, str]:
        return self.root_file, self.uki_file


def parse_sums(text: str) -> dict[str, str]:
    """SHA256SUMS lines as {name: digest}; a malformed line, a path or a repeated name is an error."""
    sums: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        m = _LINE.fullmatch(line.strip())
        if not m:
            raise UpdateError(f"{SUMS} line {number} is not '<sha256> *<file name>': {line[:80]!r}")
        digest, name = m.groups()
        if name in sums:
            raise UpdateError(f"{SUMS} names {name} twice")
        sums[name] = digest
    return sums


def release_of(sums: dict[str, str]) -> Release:
    """The one release SHA256SUMS describes: a root image and a kernel image of one version, nothing else."""
    roots = [n for n in sums if n.startswith(versioning.UKI_PREFIX) and n.endswith(ROOT_SUFFIX)]
    if len(roots) != 1:
        raise UpdateError(f"{SUMS} must list exactly one {versioning.UKI_PREFIX}<version>{ROOT_SUFFIX}; "
                          f"it lists {sorted(sums)}")
    version = versioning.check(roots[0][len(versioning.UKI_PREFIX):-len(ROOT_SUFFIX)])
    release = Release(version, dict(sums))
    extra = sorted(set(sums) - set(release.files))
    if release.uki_file not in sums or extra:
        raise UpdateError(f"{SUMS} must list {release.root_file} and {release.uki_file} and nothing else; "
                          f"it lists {sorted(sums)}")
    return release


def verified_release(sums_bytes: bytes, signature: bytes, public_key_pem: bytes) -> Release:
    """The release, once its list is signed by the trusted key; UpdateError otherwise."""
    try:
        ed25519.verify(sums_bytes, signature.decode("ascii"), public_key_pem)
    except (ed25519.BadSignature, UnicodeDecodeError):
        raise UpdateError(f"{SIGNATURE} does not verify with this box's update key: the release was altered or "
                          f"signed by another key; nothing was written") from None
    try:
        text = sums_bytes.decode("utf-8")
    except UnicodeDecodeError:
        raise UpdateError(f"{SUMS} is not text") from None
    return release_of(parse_sums(text))


def sha256_file(path: Path, progress=None, chunk: int = 4 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
            if progress:
                progress(len(block))
    return digest.hexdigest()


def write(directory: Path, version: str, private_key_pem: bytes) -> Release:
    """SHA256SUMS and SHA256SUMS.sig for the two files already in `directory` (the build's side)."""
    release = Release(versioning.check(version), {})
    sums = {name: sha256_file(directory / name) for name in sorted(release.files)}
    text = "".join(f"{digest} *{name}\n" for name, digest in sums.items())
    (directory / SUMS).write_text(text)
    (directory / SIGNATURE).write_text(ed25519.sign(text.encode(), private_key_pem) + "\n")
    return Release(version, sums)
