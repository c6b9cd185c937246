"""Reading a bundle: a directory, or a tar archive unpacked safely into a temporary directory.

Every file is read once (Bundle.read): opened without following a symlink, checked to be a regular file under
its size limit, and kept; validation hashes those bytes and apply writes the same bytes, so nothing can change
between the check and the use. The model, too large to hold, is copied once to a private file while it is hashed
(Bundle.copy_out), and that copy is parsed and installed. Archives unpack, and copies go, to a disk (/var/tmp, or
$EVERYCYCLE_STAGING_DIR), never to /tmp, which may be RAM; both go when the bundle is closed."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import tarfile
import tempfile
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from host_runtime.common.errors import InputError

MAX_TOML_BYTES = 64 << 10
MAX_FILE_BYTES = 1 << 20          # keys, certificates, passwords
MAX_MODEL_BYTES = 16 << 30        # a model in the bundle (it lives on the boot disk's EFI partition)
MAX_ARCHIVE_BYTES = MAX_MODEL_BYTES + (64 << 20)


class BundleError(InputError):
    """A bundle problem, naming the field or file at fault."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True)
class StagedCopy:
    path: Path      # private (0600, in a 0700 directory): the bytes that were hashed
    sha256: str
    mode: int       # the bundle file's permission bits when it was copied
    size: int


@dataclass
class Bundle:
    root: Path
    box: dict
    raw_toml: bytes
    temp_dir: Path | None = None   # where an archive was unpacked: removed by close()
    _files: dict = field(default_factory=dict)  # rel -> (bytes, mode), as read once
    # Where large files (the model) are copied once, streamed and hashed, instead of held in memory: apply sets
    # it on the file system they end up on (one rename); else a private directory under /var/tmp (a disk, where
    # /tmp may be RAM). Removed by close(), with whatever was not moved out of it.
    staging_parent: Path | None = None
    _staging: Path | None = None
    _copies: dict = field(default_factory=dict)  # rel -> StagedCopy

    def path(self, relative: str) -> Path:
        p = (self.root / relative).resolve()
        if self.root.resolve() not in p.parents and p != self.root.resolve():
            raise BundleError(relative, "points outside the bundle")
        return p

    def _open(self, relative: str, limit: int) -> tuple[int, os.stat_result]:
        """The file opened for reading, with its stat. BundleError: outside the bundle, missing, a symlink, not a
        regular file, or over `limit`."""
        self.path(relative)  # containment
        try:
            fd = os.open(self.root / relative, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            raise BundleError(f"files.{relative}", "the file is missing from the bundle") from None
        except OSError as exc:
            raise BundleError(f"files.{relative}", f"cannot be read ({exc.strerror}; symlinks are refused)") from None
        st = os.fstat(fd)
        problem = "is not a regular file" if not stat.S_ISREG(st.st_mode) else \
            (f"is {st.st_size} bytes; the limit is {limit}" if st.st_size > limit else None)
        if problem:
            os.close(fd)
            raise BundleError(f"files.{relative}", problem)
        return fd, st

    def read(self, relative: str, limit: int = MAX_FILE_BYTES) -> bytes:
        """The file's bytes, read once and kept (BundleError as _open says)."""
        if relative not in self._files:
            fd, st = self._open(relative, limit)
            try:
                with os.fdopen(fd, "rb", closefd=False) as handle:
                    data = handle.read(limit + 1)
                if len(data) > limit:
                    raise BundleError(f"files.{relative}", f"is over the limit of {limit} bytes")
            finally:
                os.close(fd)
            self._files[relative] = (data, stat.S_IMODE(st.st_mode))
        return self._files[relative][0]

    def copy_out(self, relative: str, limit: int) -> "StagedCopy":
        """Copy a large file once into the bundle's private staging directory, hashing it on the way: never all
        of it in memory (a 16 GiB model on a box with 8 GiB of RAM). The same checks as read(); the copy is what
        was hashed, so what is parsed and installed is what was checked."""
        if relative in self._copies:
            return self._copies[relative]
        fd, st = self._open(relative, limit)
        try:
            if self._staging is None:
                parent = self.staging_parent or staging_dir()
                parent.mkdir(parents=True, exist_ok=True)
                self._staging = Path(tempfile.mkdtemp(prefix=".everycycle-bundle-", dir=parent))  # 0700
            dest = self._staging / f"{len(self._copies)}-{Path(relative).name}"
            digest, size = hashlib.sha256(), 0
            out = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                while chunk := os.read(fd, 1 << 20):
                    size += len(chunk)
                    if size > limit:
                        raise BundleError(f"files.{relative}", f"is over the limit of {limit} bytes")
                    digest.update(chunk)
                    os.write(out, chunk)
                os.fsync(out)
            finally:
                os.close(out)
        finally:
            os.close(fd)
        copy = StagedCopy(dest, digest.hexdigest(), stat.S_IMODE(st.st_mode), size)
        self._copies[relative] = copy
        return copy

    def mode(self, relative: str) -> int:
        """The permission bits the file had when it was read or copied (read() or copy_out() first)."""
        return self._files[relative][1] if relative in self._files else self._copies[relative].mode

    def drop_copies(self) -> None:
        """Remove the staging directory and any copy still in it (apply moved out what it installed)."""
        if self._staging is not None:
            shutil.rmtree(self._staging, ignore_errors=True)
            self._staging, self._copies = None, {}

    def close(self) -> None:
        self.drop_copies()
        if self.temp_dir is not None:
            shutil.rmtree(self.temp_dir, ignore_errors=True)
            self.temp_dir = None

    def __enter__(self) -> "Bundle":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def staging_dir() -> Path:
    return Path(os.environ.get("EVERYCYCLE_STAGING_DIR", "/var/tmp"))


def _unpack(archive: Path) -> Path:
    target = Path(tempfile.mkdtemp(prefix="everycycle-bundle-", dir=staging_dir()))
    try:
        with tarfile.open(archive) as tar:
            total = 0
            for member in tar.getmembers():
                name = Path(member.name)
                if name.is_absolute() or ".." in name.parts or not (member.isfile() or member.isdir()):
                    raise BundleError(member.name, "unsafe archive member (absolute, '..', or not a plain file)")
                total += member.size
                if total > MAX_ARCHIVE_BYTES:
                    raise BundleError(member.name, f"the archive unpacks to more than {MAX_ARCHIVE_BYTES} bytes")
            tar.extractall(target, filter="data")
    except BaseException:
        shutil.rmtree(target, ignore_errors=True)
        raise
    return target


def open_bundle(location: str | Path) -> Bundle:
    location = Path(location)
    temp_dir = None
    if location.is_file() and tarfile.is_tarfile(location):
        temp_dir = _unpack(location)
        inner = [p for p in temp_dir.iterdir()]
        location = inner[0] if len(inner) == 1 and inner[0].is_dir() and not (temp_dir / "box.toml").exists() \
            else temp_dir
    try:
        if not location.is_dir():
            raise BundleError(str(location), "not a bundle directory or tar archive")
        bundle = Bundle(location, {}, b"", temp_dir)
        try:
            raw = bundle.read("box.toml", MAX_TOML_BYTES)
        except BundleError as exc:
            raise BundleError("box.toml", exc.message.replace("the file is missing from the bundle",
                                                              "missing from the bundle")) from None
        try:
            bundle.box = tomllib.loads(raw.decode("utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise BundleError("box.toml", f"not valid TOML: {exc}") from None
        bundle.raw_toml = raw
        return bundle
    except BaseException:
        if temp_dir is not None:
            shutil.rmtree(temp_dir, ignore_errors=True)
        raise
