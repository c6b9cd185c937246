"""Bringing a release onto the box, from a directory (a USB stick) or an http(s) URL on the LAN, into the
staging directory on the data partition. The signed list is read and checked first; each file is hashed as it
arrives and the staged set becomes visible (one rename) only when every hash matched. The slots and the ESP
are not touched here."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import urllib.parse
from pathlib import Path

from host_runtime.common import http_client
from host_runtime.common.atomic_file import replace_directory
from host_runtime.common.download import Progress, TooLarge, copy_hashing
from host_runtime.update import release as rel
from host_runtime.update.errors import UpdateError

FREE_SPACE_MARGIN = 256 << 20
HTTP_TIMEOUT_S = 30


class Source:
    """A release's files: a local directory, or an http(s) URL whose files sit side by side."""

    def __init__(self, where: str):
        self.where = where
        scheme = urllib.parse.urlsplit(where).scheme
        if scheme in ("http", "https"):
            self.url = where.rstrip("/") + "/"
            self.directory = None
        elif scheme in ("", "file"):
            self.url = None
            self.directory = Path(urllib.parse.urlsplit(where).path if scheme else where)
            if not self.directory.is_dir():
                raise UpdateError(f"--from {where}: not a directory (give the folder that holds "
                                  f"{rel.SUMS}, or an http(s) URL)")
        else:
            raise UpdateError(f"--from {where}: only a directory or an http(s) URL")

    def open(self, name: str):
        """(a binary stream, its size or None)."""
        if self.directory is not None:
            path = self.directory / name
            try:
                return open(path, "rb"), path.stat().st_size
            except OSError as exc:
                raise UpdateError(f"{path}: {exc.strerror}") from None
        try:
            # A release server on the LAN or beyond it (through the environment's proxy, as a download may need).
            resp = http_client.open_stream(self.url + urllib.parse.quote(name), timeout=HTTP_TIMEOUT_S,
                                           trust_env=True)
        except http_client.HTTPFailure as exc:
            raise UpdateError(f"{self.url}{name}: {exc.why}") from None
        if resp.status != 200:
            resp.close()
            raise UpdateError(f"{self.url}{name}: HTTP {resp.status}")
        length = resp.headers.get("Content-Length")
        return resp, int(length) if length and length.isdigit() else None

    def read_small(self, name: str, limit: int) -> bytes:
        stream, size = self.open(name)
        with stream:
            data = stream.read(limit + 1)
        if len(data) > limit or (size is not None and size > limit):
            raise UpdateError(f"{name} is larger than {limit} bytes: not a release's {name}")
        return data


def signed_release(source: Source, public_key_pem: bytes) -> tuple[rel.Release, bytes, bytes]:
    sums = source.read_small(rel.SUMS, rel.MAX_SUMS_BYTES)
    signature = source.read_small(rel.SIGNATURE, rel.MAX_SIGNATURE_BYTES)
    return rel.verified_release(sums, signature, public_key_pem), sums, signature


def stage(source: Source, staging: Path, public_key_pem: bytes, say=print,
          expanded_bytes: int | None = None) -> rel.Release:
    """Copy and verify a release into `staging` (replacing whatever was staged), the root image expanded for
    systemd-sysupdate. `expanded_bytes`: room the expanded root image needs (the root slot's size; by default
    the size of the running root file system, which fills its slot). Returns the release."""
    release, sums, signature = signed_release(source, public_key_pem)
    say(f"release {release.version}: {rel.SIGNATURE} verified with this box's update key")
    partial = staging.with_name(staging.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True, mode=0o700)
    try:
        streams = {name: source.open(name) for name in release.files}
        total = sum(size or 0 for _, size in streams.values())
        total += shutil.disk_usage("/").total if expanded_bytes is None else expanded_bytes
        free = shutil.disk_usage(partial).free
        if total + FREE_SPACE_MARGIN > free:
            raise UpdateError(f"the data partition has {free / 2**20:,.0f} MiB free; the release needs "
                              f"{total / 2**20:,.0f} MiB (its files, and its root image expanded) and "
                              f"{FREE_SPACE_MARGIN >> 20} MiB to spare")
        # No file of a release is larger than a root slot: one that declares no size is cut off there.
        slot = shutil.disk_usage("/").total if expanded_bytes is None else expanded_bytes
        for name, (stream, size) in streams.items():
            progress = Progress(f"copying {name}", size, say)
            try:
                digest = copy_hashing(stream, partial / name, progress, limit=slot if size is None else size)
            except TooLarge as exc:
                raise UpdateError(f"{name}: {exc} ({'its declared size' if size is not None else 'a root slot'}); "
                                  "nothing was written to a slot") from None
            if digest != release.sha256[name]:
                raise UpdateError(f"{name}: sha256 {digest} is not the {release.sha256[name]} that {rel.SUMS} "
                                  f"lists: the file was altered or damaged; nothing was written to a slot")
        _expand(partial / release.root_file, partial / release.root_staged_file, say)
        (partial / rel.SUMS).write_bytes(sums)
        (partial / rel.SIGNATURE).write_bytes(signature)
        _fsync_tree(partial)
        replace_directory(partial, staging)
    except BaseException:
        for stream, _ in locals().get("streams", {}).values():
            stream.close()
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return release


def _expand(compressed: Path, dest: Path, say) -> None:
    """The verified root image, decompressed by zstd (its frames carry their own checksums too)."""
    say(f"expanding {compressed.name} ({compressed.stat().st_size / 2**20:,.0f} MiB)")
    start = time.monotonic()
    try:
        done = subprocess.run(["zstd", "-d", "-q", "--no-progress", "-f", "-o", str(dest), str(compressed)],
                              capture_output=True, text=True)
    except FileNotFoundError:
        raise UpdateError("zstd is missing: it expands the release's root image") from None
    if done.returncode != 0:
        raise UpdateError(f"{compressed.name} does not expand: {done.stderr.strip()[-200:]}")
    compressed.unlink()
    say(f"expanded to {dest.stat().st_size / 2**20:,.0f} MiB in {time.monotonic() - start:.0f} s")


def _fsync_tree(directory: Path) -> None:
    for path in directory.iterdir():
        with open(path, "rb") as f:
            os.fsync(f.fileno())
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
