"""An image's bytes and places, apart from libmtmd (engine/projector.py): which formats the box reads, and the
token ids that stand for an image's places in a prompt. Pure; the API checks images with it too."""

from __future__ import annotations

import hashlib

PLACEHOLDER_SPAN = (1 << 31) - 1  # token ids are int32 in llama.cpp's batches and the prefix cache's keys


def placeholder_tokens(media_id: str, n: int, n_vocab: int) -> list[int]:
    """An image's places as token ids past the vocabulary: the same image gives the same ids, another image (with
    overwhelming odds: 64 bits of its hash) others."""
    start = int.from_bytes(hashlib.sha256(media_id.encode()).digest()[:8], "big")
    room = PLACEHOLDER_SPAN - n_vocab
    return [n_vocab + (start + j) % room for j in range(n)]


# The image formats libmtmd's decoder (stb_image) reads, by their first bytes. Anything else is refused before
# libmtmd sees it: for bytes it cannot decode as an image it tries audio, then video by launching ffprobe.
IMAGE_MAGIC = {b"\x89PNG\r\n\x1a\n": "png", b"\xff\xd8\xff": "jpeg", b"GIF87a": "gif", b"GIF89a": "gif", b"BM": "bmp"}


def image_format(data: bytes) -> str | None:
    """png, jpeg, gif or bmp by the bytes' signature; None for anything else."""
    return next((kind for magic, kind in IMAGE_MAGIC.items() if data.startswith(magic)), None)
