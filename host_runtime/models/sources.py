"""Where a model comes from (pure): a pull's source (an http(s) URL or hf://OWNER/REPO/FILE.gguf[@REVISION]) and
its expected sha256, checked before anything is fetched. The serving settings check a bundle's pull with these
without importing the store."""

from __future__ import annotations

import urllib.parse
from pathlib import Path

from host_runtime.models.errors import SourceRefused, StoreError
from host_runtime.placement.gguf_split import part_names


def source_file_name(source: str) -> str:
    named = hf_quant_parts(source)
    if named is not None:  # hf://OWNER/REPO:QUANT: REPO-QUANT, the store's default name for it
        return f"{named[0].split('/')[1]}-{named[1]}.gguf"
    if source.startswith("hf://"):
        return hf_parts(source)[1].rsplit("/", 1)[-1]
    return Path(urllib.parse.urlsplit(source).path).name


def part_sources(source: str) -> list[str]:
    """Every part's source, in order, where `source` (hf://OWNER/REPO/FILE.gguf[@REVISION] or an http(s) URL)
    names a split GGUF's first part (FILE-00001-of-0000N.gguf); [source] for anything else."""
    if source.startswith("hf://"):
        if hf_quant_parts(source) is not None:
            return [source]
        repo, path, revision = hf_parts(source)
        at = f"@{revision}" if revision else ""
        return [f"hf://{repo}/{each}{at}" for each in part_names(path)]
    if "://" in source:
        url = urllib.parse.urlsplit(source)
        return [urllib.parse.urlunsplit(url._replace(path=each)) for each in part_names(url.path)]
    return [source]


def hf_parts(source: str) -> tuple[str, str, str | None]:
    """hf://owner/repo/path/to/file.gguf[@revision] -> (repo, path, revision). A .bin is a Whisper model in
    whisper.cpp's own format (ggerganov/whisper.cpp's ggml-*.bin); the store reads either kind before admitting it."""
    rest = source[len("hf://"):]
    rest, _, revision = rest.partition("@")
    parts = [p for p in rest.split("/") if p]
    if len(parts) < 3 or not parts[-1].lower().endswith((".gguf", ".bin")):
        raise SourceRefused(f"SOURCE: {source!r} is not hf://OWNER/REPO/FILE.gguf[@REVISION] (or a Whisper "
                            "model's FILE.bin)")
    return "/".join(parts[:2]), "/".join(parts[2:]), revision or None


def hf_quant_parts(source: str) -> tuple[str, str, str | None] | None:
    """hf://OWNER/REPO:QUANT[@REVISION] (llama-server's -hf OWNER/REPO:QUANT) -> (repo, quant, revision); None for
    any other source."""
    if not source.startswith("hf://"):
        return None
    rest, _, revision = source[len("hf://"):].partition("@")
    repo, colon, quant = rest.partition(":")
    if not colon or repo.count("/") != 1 or not all(repo.split("/")) or not quant or "/" in quant:
        return None
    return repo, quant, revision or None


def check_sha256(expected: str | None, what: str = "--sha256") -> str | None:
    if expected is None:
        return None
    value = expected.lower()
    if len(value) != 64 or any(c not in "0123456789abcdef" for c in value):
        raise StoreError(f"{what}: {expected!r} is not a sha256 (64 hex digits)")
    return value
