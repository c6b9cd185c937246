"""An image's or a sound's bytes and places, apart from libmtmd (engine/projector.py): which formats the box reads,
and the token ids that stand for their places in a prompt. Pure; the API checks media with it too."""

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


# The most pixels an image may have: the decoder holds it whole as RGB before the projector resizes it (to 896x896
# for gemma3), so a small file that unpacks to 20,000 x 20,000 would take 1.2 GB. 25 MP (75 MB decoded) passes
# any camera's photo.
MAX_IMAGE_PIXELS = 25_000_000


def image_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) from the header of a PNG, GIF, BMP or JPEG image, without decoding it; None where the
    header does not say (a damaged file)."""
    kind = image_format(data)
    try:
        if kind == "png" and data[12:16] == b"IHDR":
            return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
        if kind == "gif":
            return int.from_bytes(data[6:8], "little"), int.from_bytes(data[8:10], "little")
        if kind == "bmp":
            return (abs(int.from_bytes(data[18:22], "little", signed=True)),
                    abs(int.from_bytes(data[22:26], "little", signed=True)))
        if kind == "jpeg":
            return _jpeg_size(data)
    except IndexError:
        return None
    return None


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    """A JPEG's size from its first start-of-frame segment (SOF0-SOF15 but DHT, JPG and DAC)."""
    i = 2
    while i + 9 < len(data):
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        length = int.from_bytes(data[i + 2:i + 4], "big")
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            return int.from_bytes(data[i + 7:i + 9], "big"), int.from_bytes(data[i + 5:i + 7], "big")
        i += 2 + length
    return None


# The audio formats libmtmd's decoder (miniaudio) reads, by their first bytes; as for images, anything else is
# refused before libmtmd sees it.
AUDIO_MAGIC = {b"fLaC": "flac", b"ID3": "mp3", b"\xff\xfb": "mp3", b"\xff\xf3": "mp3", b"\xff\xf2": "mp3"}


def audio_format(data: bytes) -> str | None:
    """wav, mp3 or flac by the bytes' signature; None for anything else."""
    if data[:4] == b"RIFF" and data[8:12] == b"WAVE":
        return "wav"
    return next((kind for magic, kind in AUDIO_MAGIC.items() if data.startswith(magic)), None)
