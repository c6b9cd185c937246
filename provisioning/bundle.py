"""Reading a bundle: a directory, or a tar archive unpacked safely into a temporary directory."""

from __future__ import annotations

import tarfile
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path


class BundleError(Exception):
    """A bundle problem, naming the field or file at fault."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass
class Bundle:
    root: Path
    box: dict
    raw_toml: bytes

    def path(self, relative: str) -> Path:
        p = (self.root / relative).resolve()
        if self.root.resolve() not in p.parents and p != self.root.resolve():
            raise BundleError(relative, "points outside the bundle")
        return p


def open_bundle(location: str | Path) -> Bundle:
    location = Path(location)
    if location.is_file() and tarfile.is_tarfile(location):
        target = Path(tempfile.mkdtemp(prefix="everycycle-bundle-"))
        with tarfile.open(location) as tar:
            for member in tar.getmembers():
                name = Path(member.name)
                if name.is_absolute() or ".." in name.parts or not (member.isfile() or member.isdir()):
                    raise BundleError(member.name, "unsafe archive member (absolute, '..', or not a plain file)")
            tar.extractall(target, filter="data")
        inner = [p for p in target.iterdir()]
        location = inner[0] if len(inner) == 1 and inner[0].is_dir() and not (target / "box.toml").exists() else target
    if not location.is_dir():
        raise BundleError(str(location), "not a bundle directory or tar archive")
    toml_path = location / "box.toml"
    try:
        raw = toml_path.read_bytes()
    except FileNotFoundError:
        raise BundleError("box.toml", "missing from the bundle") from None
    try:
        box = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise BundleError("box.toml", f"not valid TOML: {exc}") from None
    return Bundle(location, box, raw)
