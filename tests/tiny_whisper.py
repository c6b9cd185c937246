"""Random-weight Whisper models in whisper.cpp's own file format (ggml's legacy binary: the magic, eleven
hyperparameters, the mel filters, the vocabulary, then each tensor with its dimensions, name and type), as its
converter writes them and its loader (src/whisper.cpp whisper_model_load) reads them back.

Sizes: "test" (64 wide, one layer each side: a 7 MB file that loads in milliseconds), and the real shapes of
Whisper's tiny, base and small, for the benchmark's real-time factors (compute is the weights' shape, not their
values). The vocabulary is multilingual (51865 tokens: whisper.cpp places its special tokens by that count), its
text tokens plain ASCII (a random model's transcript is nonsense either way; ASCII keeps it valid UTF-8).
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

GGML_FILE_MAGIC = 0x67676D6C
N_VOCAB = 51865   # multilingual
N_TEXT_TOKENS = 50257  # the GPT-2 text tokens below the specials (whisper.cpp adds the specials itself)
N_AUDIO_CTX = 1500  # 30 s of 10 ms mel frames, halved by the second convolution
N_TEXT_CTX = 448
N_MELS = 80
N_FFT = 201
SIZES = {  # name: (width, heads, layers): OpenAI's shapes
    "test": (64, 2, 1),
    "tiny": (384, 6, 4),
    "base": (512, 8, 6),
    "small": (768, 12, 12),
}


def write_whisper(path: Path, size: str = "test", *, seed: int = 0) -> Path:
    """A Whisper model of `size` with random F16 weights at `path`."""
    width, heads, layers = SIZES[size]
    rng = np.random.default_rng(seed)
    with open(path, "wb") as f:
        f.write(struct.pack("<I", GGML_FILE_MAGIC))
        f.write(struct.pack("<11i", N_VOCAB, N_AUDIO_CTX, width, heads, layers, N_TEXT_CTX, width, heads, layers,
                            N_MELS, 1))
        f.write(struct.pack("<2i", N_MELS, N_FFT))
        f.write(rng.uniform(0.0, 0.02, (N_MELS, N_FFT)).astype("<f4").tobytes())
        f.write(struct.pack("<i", N_TEXT_TOKENS))
        for i in range(N_TEXT_TOKENS):
            word = bytes([32 + i]) if i < 95 else f" w{i}".encode()
            f.write(struct.pack("<i", len(word)) + word)
        for name, shape, half in _tensors(width, layers):
            if "ln" in name.rsplit(".", 2)[-2] and name.endswith(".weight"):  # the layer norms' gains
                data = np.ones(shape, dtype=np.float32)
            elif name.endswith(".bias"):
                data = np.zeros(shape, dtype=np.float32)
            else:  # scaled by the fan-in, so that the sound still moves the decoder's choice after the layers
                fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else width
                data = rng.standard_normal(shape, dtype=np.float32) * (1.0 / np.sqrt(fan_in))
            data = data.astype("<f2" if half else "<f4")
            encoded = name.encode()
            f.write(struct.pack("<3i", len(shape), len(encoded), 1 if half else 0))
            f.write(struct.pack(f"<{len(shape)}i", *reversed(shape)))  # ggml's order: the fastest dimension first
            f.write(encoded)
            f.write(data.tobytes())
    return path


def _tensors(width: int, layers: int):
    """(name, numpy shape, stored as F16) for every tensor whisper.cpp expects."""
    yield "encoder.positional_embedding", (N_AUDIO_CTX, width), False
    yield "encoder.conv1.weight", (width, N_MELS, 3), True
    yield "encoder.conv1.bias", (width, 1), False
    yield "encoder.conv2.weight", (width, width, 3), True
    yield "encoder.conv2.bias", (width, 1), False
    yield "encoder.ln_post.weight", (width,), False
    yield "encoder.ln_post.bias", (width,), False
    for i in range(layers):
        yield from _block(f"encoder.blocks.{i}", width, cross=False)
    yield "decoder.positional_embedding", (N_TEXT_CTX, width), False
    yield "decoder.token_embedding.weight", (N_VOCAB, width), True
    yield "decoder.ln.weight", (width,), False
    yield "decoder.ln.bias", (width,), False
    for i in range(layers):
        yield from _block(f"decoder.blocks.{i}", width, cross=True)


def _block(prefix: str, width: int, cross: bool):
    attentions = ("attn", "cross_attn") if cross else ("attn",)
    yield f"{prefix}.mlp_ln.weight", (width,), False
    yield f"{prefix}.mlp_ln.bias", (width,), False
    yield f"{prefix}.mlp.0.weight", (4 * width, width), True
    yield f"{prefix}.mlp.0.bias", (4 * width,), False
    yield f"{prefix}.mlp.2.weight", (width, 4 * width), True
    yield f"{prefix}.mlp.2.bias", (width,), False
    for attn in attentions:
        yield f"{prefix}.{attn}_ln.weight", (width,), False
        yield f"{prefix}.{attn}_ln.bias", (width,), False
        yield f"{prefix}.{attn}.query.weight", (width, width), True
        yield f"{prefix}.{attn}.query.bias", (width,), False
        yield f"{prefix}.{attn}.key.weight", (width, width), True
        yield f"{prefix}.{attn}.value.weight", (width, width), True
        yield f"{prefix}.{attn}.value.bias", (width,), False
        yield f"{prefix}.{attn}.out.weight", (width, width), True
        yield f"{prefix}.{attn}.out.bias", (width,), False
