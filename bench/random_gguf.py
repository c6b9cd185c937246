#!/usr/bin/env python3
"""A random-weight GGUF with a published model's tensor table at Q4_K_M, written where it is used (the device
check writes it on the lent GPU machine: 4.9 GB would not travel in its 64 MiB).

Llama 3.1 8B's shapes (32 layers, 4096 wide, 8 KV heads of 32, FFN 14336, 128,256 tokens), or TinyLlama 1.1B's:
the same weights, KV cache and compute buffers as the real file, so speed and placement are the real model's. Its
answers are nonsense. Q4_K blocks get small scales (d 0.01, dmin 0.005), Q6_K blocks d 0.01, norms 1.0, so activations stay
finite; the rest of each block is random. Tokenizer: byte tokens padded to the vocabulary with unused ones, a
ChatML template (the chat APIs need one).

    python bench/random_gguf.py llama3.1-8b OUT.gguf
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import gguf
import numpy as np

Q = gguf.GGMLQuantizationType
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SHAPES = {"llama3.1-8b": dict(n_embd=4096, n_layer=32, n_head=32, n_head_kv=8, n_ff=14336, n_vocab=128256,
                              n_ctx=131072, rope_theta=500000.0),
          # TinyLlama 1.1B's (0.6 GiB at Q4_K_M): a real architecture small enough to split across namespaced
          # boxes in a test (tests/test_shard.py)
          "tinyllama-1.1b": dict(n_embd=2048, n_layer=22, n_head=32, n_head_kv=4, n_ff=5632, n_vocab=32000,
                                 n_ctx=2048, rope_theta=10000.0)}


def _more_bits(i: int, n: int) -> bool:
    """llama-quant.cpp's use_more_bits: the layers whose attn_v and ffn_down Q4_K_M keeps in Q6_K."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def tensor_table(s: dict) -> list[tuple[str, tuple[int, ...], Q]]:
    """(name, shape in ggml's order, type) as llama.cpp's Q4_K_M lays out a llama."""
    e, f, v, kv = s["n_embd"], s["n_ff"], s["n_vocab"], s["n_embd"] // s["n_head"] * s["n_head_kv"]
    t = [("token_embd.weight", (e, v), Q.Q4_K), ("output_norm.weight", (e,), Q.F32), ("output.weight", (e, v), Q.Q6_K)]
    for i in range(s["n_layer"]):
        b, more = f"blk.{i}.", _more_bits(i, s["n_layer"])
        t += [(b + "attn_norm.weight", (e,), Q.F32), (b + "attn_q.weight", (e, e), Q.Q4_K),
              (b + "attn_k.weight", (e, kv), Q.Q4_K), (b + "attn_v.weight", (e, kv), Q.Q6_K if more else Q.Q4_K),
              (b + "attn_output.weight", (e, e), Q.Q4_K), (b + "ffn_norm.weight", (e,), Q.F32),
              (b + "ffn_gate.weight", (e, f), Q.Q4_K), (b + "ffn_up.weight", (e, f), Q.Q4_K),
              (b + "ffn_down.weight", (f, e), Q.Q6_K if more else Q.Q4_K)]
    return t


def _block_pattern(ty: Q, blocks: int, rng) -> bytes:
    """`blocks` random blocks of type `ty` with their scales set small and finite."""
    size = gguf.GGML_QUANT_SIZES[ty][1]
    raw = rng.integers(0, 256, size=(blocks, size), dtype=np.uint8)
    if ty == Q.Q4_K:  # d, dmin (fp16) first
        raw[:, 0:2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
        raw[:, 2:4] = np.frombuffer(np.float16(0.005).tobytes(), np.uint8)
    elif ty == Q.Q6_K:  # d (fp16) last
        raw[:, size - 2:size] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
    return raw.tobytes()


def write(shape: str, path: Path) -> Path:
    s = SHAPES[shape]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(f"random-{shape}-Q4_K_M")
    w.add_context_length(s["n_ctx"])
    w.add_embedding_length(s["n_embd"])
    w.add_block_count(s["n_layer"])
    w.add_feed_forward_length(s["n_ff"])
    w.add_head_count(s["n_head"])
    w.add_head_count_kv(s["n_head_kv"])
    w.add_rope_dimension_count(s["n_embd"] // s["n_head"])
    w.add_rope_freq_base(s["rope_theta"])
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    specials = [b"<unk>", b"<s>", b"</s>", b"<|im_start|>", b"<|im_end|>"]
    tokens = specials + [f"<0x{b:02X}>".encode() for b in range(256)]
    tokens += [f"<unused_{i}>".encode() for i in range(s["n_vocab"] - len(tokens))]
    types = ([gguf.TokenType.UNKNOWN] + [gguf.TokenType.CONTROL] * 4 + [gguf.TokenType.BYTE] * 256
             + [gguf.TokenType.UNUSED] * (s["n_vocab"] - 261))
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * len(tokens))
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(4)
    w.add_add_bos_token(True)
    w.add_chat_template(CHATML)
    table = tensor_table(s)
    for name, dims, ty in table:
        nbytes = gguf.quant_shape_to_byte_shape(tuple(reversed(dims)), ty) if ty != Q.F32 else None
        if ty == Q.F32:
            w.add_tensor_info(name, tuple(reversed(dims)), np.dtype(np.float32), dims[0] * 4, raw_dtype=ty)
        else:
            w.add_tensor_info(name, nbytes, np.dtype(np.uint8), int(np.prod(nbytes)), raw_dtype=ty)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    rng = np.random.default_rng(0)
    patterns = {ty: _block_pattern(ty, 1 << 14, rng) for ty in (Q.Q4_K, Q.Q6_K)}
    align = w.data_alignment
    with open(path, "r+b") as f:
        f.seek(0, 2)
        f.write(b"\0" * (gguf.GGUFWriter.ggml_pad(f.tell(), align) - f.tell()))
        for _name, dims, ty in table:
            if ty == Q.F32:
                data = np.ones(dims[0], np.float32).tobytes()
            else:
                block, size = gguf.GGML_QUANT_SIZES[ty]
                n = int(np.prod(dims)) // block * size
                reps, rest = divmod(n, len(patterns[ty]))
                for _ in range(reps):
                    f.write(patterns[ty])
                data = patterns[ty][:rest]
            f.write(data)
            f.write(b"\0" * (gguf.GGUFWriter.ggml_pad(f.tell(), align) - f.tell()))
    return path


def main() -> int:
    if len(sys.argv) != 3 or sys.argv[1] not in SHAPES:
        print(__doc__.strip().splitlines()[-1].strip() + f"   (shapes: {', '.join(SHAPES)})", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    path = write(sys.argv[1], Path(sys.argv[2]))
    print(f"{path}: {path.stat().st_size / 2**30:.2f} GiB in {time.monotonic() - t0:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
