"""A Whisper model in whisper.cpp's own file format (ggml's legacy binary, `ggml-base.bin` and the like): its
shape from the header, and what it holds once loaded, as whisper.cpp allocates it (pure but for reading the
header's 48 bytes).

Measured on whisper.cpp 1.8.5 (pywhispercpp 1.5.1) for widths 64, 512 (base) and 768 (small), each line of its
load log: the self-attention KV is 2 x text layers x 512 places (448 rounded up) x width in F16, the cross KV
2 x text layers x 1536 (1500 rounded up) x width, one more audio layer's worth of padding, and the four compute
buffers 100 MB + 79 kB per unit of width (the decoder's, ~95 MB, is the logits over the 51865-token vocabulary).
The formula below gives base 316 MB and small 808 MB; the process's resident growth measured 223 and 616 MiB
(buffers not all touched), so the plan errs on the side of room.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

GGML_FILE_MAGIC = 0x67676D6C
HEADER = struct.Struct("<I11i")
SIZE_NAMES = {4: "tiny", 6: "base", 12: "small", 24: "medium", 32: "large"}  # by audio layers, as whisper.cpp
SELF_KV_PLACES = 512     # n_text_ctx 448, padded
CROSS_KV_PLACES = 1536   # n_audio_ctx 1500, padded
COMPUTE_BASE_BYTES = 100_000_000
COMPUTE_BYTES_PER_WIDTH = 79_000


@dataclass(frozen=True)
class WhisperShape:
    n_vocab: int
    n_audio_ctx: int
    width: int
    heads: int
    audio_layers: int
    n_text_ctx: int
    text_layers: int
    n_mels: int
    ftype: int  # ggml's file type: 0 F32, 1 F16, 7 Q8_0, ...

    @property
    def size_name(self) -> str:
        return SIZE_NAMES.get(self.audio_layers, "unknown")

    @property
    def quantization(self) -> str:
        return {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1"}.get(
            self.ftype % 1000, f"type {self.ftype}")


def read_shape(path: str | Path) -> WhisperShape | None:
    """The model's shape, or None where the file is not a whisper.cpp model (a GGUF, say)."""
    try:
        with open(path, "rb") as f:
            head = f.read(HEADER.size)
    except OSError:
        return None
    if len(head) < HEADER.size:
        return None
    magic, n_vocab, n_audio_ctx, width, heads, audio_layers, n_text_ctx, text_width, _, text_layers, n_mels, ftype \
        = HEADER.unpack(head)
    if magic != GGML_FILE_MAGIC or text_width != width:  # whisper.cpp asserts the two widths are one
        return None
    shape = WhisperShape(n_vocab, n_audio_ctx, width, heads, audio_layers, n_text_ctx, text_layers, n_mels, ftype)
    if min(shape.n_vocab, shape.width, shape.heads, shape.audio_layers, shape.text_layers, shape.n_mels) <= 0:
        return None
    return shape


def is_whisper(path: str | Path) -> bool:
    return read_shape(path) is not None


def resident_bytes(shape: WhisperShape, file_bytes: int) -> int:
    """What a loaded model holds: its weights (the file, less a few MB of vocabulary), both KV caches and the
    compute buffers (see the module's words for where each figure comes from)."""
    self_kv = 2 * shape.text_layers * SELF_KV_PLACES * shape.width * 2
    cross_kv = 2 * shape.text_layers * CROSS_KV_PLACES * shape.width * 2
    pad_kv = 2 * CROSS_KV_PLACES * shape.width * 2
    compute = COMPUTE_BASE_BYTES + COMPUTE_BYTES_PER_WIDTH * shape.width
    return file_bytes + self_kv + cross_kv + pad_kv + compute
