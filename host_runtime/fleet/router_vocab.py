"""The one data file the fleet's router needs and cannot fetch offline.

sglang-router 0.3.2 in IGW mode (the mode that routes by model) builds its gRPC pipeline's Harmony encoding at
start, whether or not a gRPC worker exists, and that needs OpenAI's o200k_base vocabulary: without it the router
panics ("Failed to load Harmony encoding"), and it would download it from the internet, which a LAN box may not
reach. The router reads it from TIKTOKEN_ENCODINGS_BASE and checks its SHA-256 itself. The file is public; the
litellm wheel on PyPI carries it (as a tiktoken cache entry), so it is fetched with the machine's own pip
configuration, read out of the wheel as data and checked against the same hash. No litellm code is installed or
run (two of its releases were published malicious: the wheel is pinned and only this one member is read).

Run at install time (image/install-venv.sh); the gateway finds the file under the venv."""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from host_runtime.common.errors import InputError
from host_runtime.common.atomic_file import atomic_write

FILE_NAME = "o200k_base.tiktoken"
SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"  # the hash the router checks
CARRIER = "litellm==1.110.2"
MEMBER = "litellm/litellm_core_utils/tokenizers/fb374d419588a4632f3f557e76b4b70aebbca790"  # sha1 of its URL


class VocabError(InputError):
    """The vocabulary could not be had; says why."""


def default_dir() -> Path:
    return Path(sys.prefix) / "share" / "everycycle" / "router-vocab"


def present(directory: Path) -> bool:
    path = directory / FILE_NAME
    return path.is_file() and hashlib.sha256(path.read_bytes()).hexdigest() == SHA256


def ensure(directory: Path | None = None) -> Path:
    """The directory holding a checked vocabulary, fetching it first if needed."""
    directory = directory or default_dir()
    if present(directory):
        return directory
    if present(default_dir()):  # another copy (the image's wheelhouse) of the venv's own
        data = (default_dir() / FILE_NAME).read_bytes()
    else:
        data = _from_carrier()
    digest = hashlib.sha256(data).hexdigest()
    if digest != SHA256:
        raise VocabError(f"{FILE_NAME} from {CARRIER} has SHA-256 {digest}, expected {SHA256}")
    directory.mkdir(parents=True, exist_ok=True)
    atomic_write(directory / FILE_NAME, data, 0o644)
    return directory


def _from_carrier() -> bytes:
    with tempfile.TemporaryDirectory() as tmp:
        got = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:",
                              "-d", tmp, CARRIER], capture_output=True, text=True)
        wheels = list(Path(tmp).glob("litellm-*.whl"))
        if got.returncode != 0 or not wheels:
            raise VocabError(f"pip could not fetch {CARRIER} (which carries {FILE_NAME}): "
                             f"{(got.stderr or got.stdout).strip()[-400:]}")
        with zipfile.ZipFile(wheels[0]) as wheel:
            return wheel.read(MEMBER)


def main() -> int:
    p = argparse.ArgumentParser(description=f"fetch and check {FILE_NAME} for the fleet's router")
    p.add_argument("--dir", type=Path, default=None, help=f"where to put it (default {default_dir()})")
    args = p.parse_args()
    try:
        where = ensure(args.dir)
    except VocabError as exc:
        print(f"router vocabulary: {exc}", file=sys.stderr)
        return 1
    print(f"router vocabulary: {where / FILE_NAME} (SHA-256 checked)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
