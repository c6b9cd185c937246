"""Where a model comes from (pure): a pull's source (an http(s) URL or hf://OWNER/REPO/FILE.gguf[@REVISION]) and
its expected sha256, checked before anything is fetched. The serving settings check a bundle's pull with these
without importing the store."""

from __future__ import annotations

import urllib.parse
from pathlib import Path

from host_runtime.models.errors import SourceRefused, StoreError


def source_file_name(source: str) -> str:
    if source.startswith("hf://"):
        return hf_parts(source)[1].rsplit("/", 1)[-1]
    return Path(urllib.parse.urlsplit(source).path).name


def hf_parts(source: str) -> tuple[str, str, str | None]:
    """hf://owner/repo/path/to/file.gguf[@revision] -> (repo, path, revision)."""
    rest = source[len("hf://"):]
    rest, _, revision = rest.partition("@")
    parts = [p for p in rest.split("/") if p]
    if len(parts) < 3 or not parts[-1].lower().endswith(".gguf"):
        raise SourceRefused(f"SOURCE: {source!r} is not hf://OWNER/REPO/FILE.gguf[@REVISION]")
    return "/".join(parts[:2]), "/".join(parts[2:]), revision or None


def check_sha256(expected: str | None, what: str = "--sha256") -> str | None:
    if expected is None:
        return None
    value = expected.lower()
    if len(value) != 64 or any(c not in "0123456789abcdef" for c in value):
        raise StoreError(f"{what}: {expected!r} is not a sha256 (64 hex digits)")
    return value
