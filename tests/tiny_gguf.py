"""Tiny random-weight llama GGUFs for edge cases, written with the `gguf` package.

Vocabulary: 3 specials plus the 256 byte tokens, so random sampling produces
arbitrary bytes (broken UTF-8 included); no chat template; a small context.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def _llama_writer(path: Path, name: str, n_ctx: int, n_embd: int, n_layer: int, n_head: int, n_ff: int,
                  n_head_kv: int | None = None, matrix_type: str = "f32", split_max_tensors: int = 0):
    """A GGUF writer with a llama's hyperparameters set (F32 tensors, or matrices in matrix_type). split_max_tensors:
    a split GGUF of parts of at most that many tensors (STEM-00001-of-0000N.gguf beside `path`), as gguf-split
    writes a large model."""
    import gguf

    w = gguf.GGUFWriter(str(path), "llama", split_max_tensors=split_max_tensors)
    w.add_name(name)
    w.add_context_length(n_ctx)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv or n_head)
    w.add_rope_dimension_count(n_embd // n_head)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type({"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
                     "q4_1": gguf.LlamaFileType.MOSTLY_Q4_1}[matrix_type])
    return w


def _byte_vocabulary() -> tuple[list[bytes], list]:
    """3 specials (<unk>, <s>, </s>) and the 256 byte tokens, with their token types."""
    import gguf

    tokens = [b"<unk>", b"<s>", b"</s>"] + [f"<0x{b:02X}>".encode() for b in range(256)]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL] + [gguf.TokenType.BYTE] * 256
    return tokens, types


def _add_byte_tokenizer(w, tokens: list[bytes], types: list) -> None:
    """A llama (SentencePiece-style) tokenizer over those tokens, <s> and </s> its BOS and EOS."""
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * len(tokens))
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)


def _write_out(w) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _llama_blocks(w, t, n_layer: int, n_embd: int, n_ff: int, kv_width: int | None = None) -> None:
    """The repeating blocks (random matrices from t(name, *shape), unit norms) and the output norm. kv_width: K's
    and V's rows (n_head_kv * head_dim) where the model groups its query heads."""
    for i in range(n_layer):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        for part, rows in (("q", n_embd), ("k", kv_width or n_embd), ("v", kv_width or n_embd), ("output", n_embd)):
            t(f"blk.{i}.attn_{part}.weight", rows, n_embd)
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
        t(f"blk.{i}.ffn_gate.weight", n_ff, n_embd)
        t(f"blk.{i}.ffn_up.weight", n_ff, n_embd)
        t(f"blk.{i}.ffn_down.weight", n_embd, n_ff)
    w.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))


# gpt-oss's harmony markers: llama.cpp renders the first five as text and ends a generation at the last two.
HARMONY_SPECIALS = ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>")


def write_tiny_llama(path: Path, *, n_ctx: int = 64, n_embd: int = 32, n_layer: int = 2, n_head: int = 4,
                     n_ff: int = 64, seed: int = 0, chat_template: str | None = None,
                     pooling_type: int | None = None, fim: bool = False, specials: tuple[str, ...] = (),
                     split_max_tensors: int = 0) -> Path:
    """split_max_tensors: written as a split GGUF, parts of at most that many tensors; the first part's path is
    returned. pooling_type (gguf.PoolingType): an embedding model's, as an embedding GGUF declares it. fim: the
    vocabulary gets fill-in-the-middle tokens (<fim_prefix>, <fim_suffix>, <fim_middle>), named in the metadata as
    a code model's GGUF names them. specials: more control tokens, by their text (a model family's markers, which
    llama.cpp recognises by that text: HARMONY_SPECIALS)."""
    import gguf

    rng = np.random.default_rng(seed)
    tokens, types = _byte_vocabulary()
    fim_ids = {}
    if fim:
        for role, text in (("pre", b"<fim_prefix>"), ("suf", b"<fim_suffix>"), ("mid", b"<fim_middle>")):
            fim_ids[role] = len(tokens)
            tokens.append(text)
            types.append(gguf.TokenType.CONTROL)
    for text in specials:
        tokens.append(text.encode())
        types.append(gguf.TokenType.CONTROL)
    n_vocab = len(tokens)

    w = _llama_writer(path, "tiny-random-llama", n_ctx, n_embd, n_layer, n_head, n_ff,
                      split_max_tensors=split_max_tensors)
    _add_byte_tokenizer(w, tokens, types)
    for role, token in fim_ids.items():
        w.add_uint32(f"tokenizer.ggml.fim_{role}_token_id", token)
    if chat_template is not None:
        w.add_chat_template(chat_template)
    if pooling_type is not None:
        w.add_pooling_type(gguf.PoolingType(pooling_type))

    def t(name: str, *shape: int, scale: float = 0.2):
        w.add_tensor(name, (rng.standard_normal(shape) * scale).astype(np.float32))

    t("token_embd.weight", n_vocab, n_embd)
    _llama_blocks(w, t, n_layer, n_embd, n_ff)
    t("output.weight", n_vocab, n_embd, scale=2.0)  # large logits: sampling wanders over every byte
    _write_out(w)
    if split_max_tensors:
        return sorted(path.parent.glob(f"{path.stem}-00001-of-*.gguf"))[0]
    return path


def write_long_context_llama(path: Path, *, n_ctx: int = 32768, n_embd: int = 64, n_layer: int = 2, n_head: int = 4,
                             n_ff: int = 128, seed: int = 0, eos_logit: float = 0.0, n_head_kv: int | None = None,
                             matrix_type: str = "f32") -> Path:
    """A random-weight llama with the default model's own tokenizer and chat template (SmolLM2's BPE, ChatML) and
    a long trained context: for clients whose real prompts (10,000 tokens and more) the default model's 8,192
    cannot hold. Its text is nonsense; the protocol around it is what a test checks. eos_logit > 0 makes its
    answers short: every token embedding carries one constant dimension, which the end-of-generation token's
    output row reads (about eos_logit, against the others' random logits). With SmolLM2-135M's own shape
    and quantization (n_embd=576, n_layer=30, n_head=9, n_head_kv=3, n_ff=1536, matrix_type="q4_1") its work
    per token is the default model's: the benchmarks' long-context stand-in."""
    import gguf

    from host_runtime.engine.model import default_model_path

    source = gguf.GGUFReader(str(default_model_path()))

    def value(key: str):
        f = source.fields[key]
        if f.types[0] == gguf.GGUFValueType.ARRAY:
            if f.types[-1] == gguf.GGUFValueType.STRING:
                return [bytes(f.parts[i]).decode("utf-8") for i in f.data]
            return [int(f.parts[i][0]) for i in f.data]
        if f.types[0] == gguf.GGUFValueType.STRING:
            return bytes(f.parts[f.data[0]]).decode("utf-8")
        return f.parts[f.data[0]][0].item()

    rng = np.random.default_rng(seed)
    tokens = value("tokenizer.ggml.tokens")
    n_vocab = len(tokens)
    w = _llama_writer(path, "random-long-context-llama", n_ctx, n_embd, n_layer, n_head, n_ff, n_head_kv,
                      matrix_type)
    w.add_tokenizer_model(value("tokenizer.ggml.model"))
    w.add_tokenizer_pre(value("tokenizer.ggml.pre"))
    w.add_token_list(tokens)
    w.add_token_types(value("tokenizer.ggml.token_type"))
    w.add_token_merges(value("tokenizer.ggml.merges"))
    for key, add in (("tokenizer.ggml.bos_token_id", w.add_bos_token_id),
                     ("tokenizer.ggml.eos_token_id", w.add_eos_token_id),
                     ("tokenizer.ggml.unknown_token_id", w.add_unk_token_id),
                     ("tokenizer.ggml.padding_token_id", w.add_pad_token_id)):
        add(value(key))
    w.add_add_bos_token(bool(value("tokenizer.ggml.add_bos_token")))
    w.add_chat_template(value("tokenizer.chat_template"))

    def add_matrix(name: str, values) -> None:
        if matrix_type == "q4_1":
            w.add_tensor(name, gguf.quants.quantize(values, gguf.GGMLQuantizationType.Q4_1),
                         raw_dtype=gguf.GGMLQuantizationType.Q4_1)
        else:
            w.add_tensor(name, values.astype(np.float16 if matrix_type == "f16" else np.float32))

    def t(name: str, *shape: int, scale: float = 0.2):
        add_matrix(name, rng.standard_normal(shape, dtype=np.float32) * scale)

    embd = (rng.standard_normal((n_vocab, n_embd)) * 0.2).astype(np.float32)
    if eos_logit:
        embd[:, 0] = 40.0  # the constant dimension: it outweighs the rest, so the final norm leaves most of it
    add_matrix("token_embd.weight", embd)
    _llama_blocks(w, t, n_layer, n_embd, n_ff, n_embd // n_head * (n_head_kv or n_head))
    head = (rng.standard_normal((n_vocab, n_embd)) * 0.2).astype(np.float32)
    if eos_logit:
        head[:, 0] = 0.0
        head[value("tokenizer.ggml.eos_token_id"), 0] = eos_logit / np.sqrt(n_embd)
    add_matrix("output.weight", head)
    _write_out(w)
    return path


def write_tiny_moe(path: Path, *, n_layer: int = 4, n_embd: int = 256, n_head: int = 4, n_expert: int = 16,
                   n_expert_used: int = 2, n_ff_exp: int = 512, n_ctx: int = 1024, seed: int = 0) -> Path:
    """A random-weight Qwen3-MoE (llama.cpp's qwen3moe: attention with q/k norms, a router and routed experts
    in F32) that really loads: its experts are most of its bytes (about 25 MiB a layer at the defaults), so
    where they are placed shows in llama.cpp's buffers. Byte vocabulary as write_tiny_llama's."""
    import gguf

    rng = np.random.default_rng(seed)
    tokens, types = _byte_vocabulary()
    n_vocab, hd = len(tokens), n_embd // n_head
    w = gguf.GGUFWriter(str(path), "qwen3moe")
    w.add_name("tiny-random-qwen3moe")
    w.add_context_length(n_ctx)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff_exp)
    w.add_expert_feed_forward_length(n_ff_exp)
    w.add_expert_count(n_expert)
    w.add_expert_used_count(n_expert_used)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    _add_byte_tokenizer(w, tokens, types)

    def t(name: str, *shape: int, scale: float = 0.2):  # numpy order: the last dimension is ggml's first
        w.add_tensor(name, (rng.standard_normal(shape) * scale).astype(np.float32))

    t("token_embd.weight", n_vocab, n_embd)
    for i in range(n_layer):
        b = f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        for part in ("q", "k", "v"):
            t(b + f"attn_{part}.weight", n_embd, n_embd)
        t(b + "attn_output.weight", n_embd, n_embd)
        w.add_tensor(b + "attn_q_norm.weight", np.ones(hd, dtype=np.float32))
        w.add_tensor(b + "attn_k_norm.weight", np.ones(hd, dtype=np.float32))
        w.add_tensor(b + "ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
        t(b + "ffn_gate_inp.weight", n_expert, n_embd)
        t(b + "ffn_gate_exps.weight", n_expert, n_ff_exp, n_embd)
        t(b + "ffn_up_exps.weight", n_expert, n_ff_exp, n_embd)
        t(b + "ffn_down_exps.weight", n_expert, n_embd, n_ff_exp)
    w.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    t("output.weight", n_vocab, n_embd, scale=2.0)
    _write_out(w)
    return path


# clip.{vision,audio}.KEY for each hyperparameter the writers give by its short name
_CLIP_KEYS = {"head_count": "attention.head_count", "scale_factor": "projector.scale_factor",
              "stack_factor": "projector.stack_factor"}


def _clip_writer(path: Path, encoder: str, projector_type: str, eps: float, **numbers: int):
    """A projector GGUF's writer (architecture clip) with an encoder's ("vision" or "audio") hyperparameters."""
    import gguf

    w = gguf.GGUFWriter(str(path), "clip")
    w.add_bool(f"clip.has_{encoder}_encoder", True)
    w.add_string(f"clip.{encoder}.projector_type", projector_type)
    for key, number in numbers.items():
        w.add_uint32(f"clip.{encoder}.{_CLIP_KEYS.get(key, key)}", number)
    w.add_float32(f"clip.{encoder}.attention.layer_norm_epsilon", eps)
    return w


def write_gemma3_projector(path: Path, *, n_embd_text: int, image_size: int = 64, patch: int = 8, n_embd: int = 32,
                           n_ff: int = 48, n_layer: int = 1, n_head: int = 2, merge: int = 2, seed: int = 0) -> Path:
    """A random-weight gemma3 vision projector (SigLIP blocks, then gemma3's pooling and projection) that libmtmd
    loads and runs for a text model of width n_embd_text: a 64x64 image in 8x8 patches pooled 2x2 is 16 places.
    Its feed-forward width differs from its embedding width, which libmtmd requires to tell them apart."""

    rng = np.random.default_rng(seed)
    w = _clip_writer(path, "vision", "gemma3", 1e-6, image_size=image_size, patch_size=patch,
                     embedding_length=n_embd, feed_forward_length=n_ff, block_count=n_layer,
                     projection_dim=n_embd_text, head_count=n_head, scale_factor=merge)
    w.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    w.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
    w.add_bool("clip.use_gelu", True)

    def t(name: str, *shape: int, scale: float = 0.2):
        w.add_tensor(name, (rng.standard_normal(shape) * scale).astype(np.float32))

    def norm(name: str, n: int):
        w.add_tensor(f"{name}.weight", np.ones(n, dtype=np.float32))
        w.add_tensor(f"{name}.bias", np.zeros(n, dtype=np.float32))

    def linear(name: str, rows: int, cols: int):
        t(f"{name}.weight", rows, cols)
        w.add_tensor(f"{name}.bias", np.zeros(rows, dtype=np.float32))

    t("v.patch_embd.weight", n_embd, 3, patch, patch)
    w.add_tensor("v.patch_embd.bias", np.zeros(n_embd, dtype=np.float32))
    t("v.position_embd.weight", (image_size // patch) ** 2, n_embd)
    for i in range(n_layer):
        norm(f"v.blk.{i}.ln1", n_embd)
        for part in ("attn_q", "attn_k", "attn_v", "attn_out"):
            linear(f"v.blk.{i}.{part}", n_embd, n_embd)
        norm(f"v.blk.{i}.ln2", n_embd)
        linear(f"v.blk.{i}.ffn_up", n_ff, n_embd)
        linear(f"v.blk.{i}.ffn_down", n_embd, n_ff)
    norm("v.post_ln", n_embd)
    t("mm.input_projection.weight", n_embd, n_embd_text)
    w.add_tensor("mm.soft_emb_norm.weight", np.ones(n_embd, dtype=np.float32))
    _write_out(w)
    return path


def write_vision_pair(directory: Path, *, n_embd: int = 64) -> tuple[Path, Path]:
    """A text model with SmolLM2's tokenizer and chat template (ChatML) and a gemma3 projector made for its width:
    the pair `serve --model ... --mmproj ...` takes."""
    directory.mkdir(parents=True, exist_ok=True)
    text = write_long_context_llama(directory / "tiny-vision.gguf", n_ctx=4096, n_embd=n_embd)
    return text, write_gemma3_projector(directory / "mmproj-tiny-vision.gguf", n_embd_text=n_embd)


def png(width: int, height: int, pixel) -> bytes:
    """A PNG of one colour (pixel: an (r, g, b) function of (x, y) or a tuple), made with the standard library."""
    import struct
    import zlib

    colour = pixel if callable(pixel) else (lambda x, y: pixel)
    rows = b"".join(b"\x00" + b"".join(bytes(colour(x, y)) for x in range(width)) for y in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def write_ultravox_projector(path: Path, *, n_embd_text: int, n_mel: int = 128, n_embd: int = 32, n_ff: int = 48,
                             n_layer: int = 1, n_head: int = 2, stack: int = 15, hidden: int = 40,
                             seed: int = 0) -> Path:
    """A random-weight ultravox audio projector (a Whisper encoder, frames stacked `stack` at a time, then
    ultravox's SwiGLU projection) that libmtmd loads and runs for a text model of width n_embd_text: a sound is
    cut into 30 s windows of 1500 encoder frames, each 1500 / stack places (100 here). The stack must divide 1500
    (ultravox's real 8 aborts in clip_encode on this llama.cpp), and the feed-forward width differ from the
    embedding width."""

    rng = np.random.default_rng(seed)
    w = _clip_writer(path, "audio", "ultravox", 1e-5, num_mel_bins=n_mel, embedding_length=n_embd,
                     feed_forward_length=n_ff, block_count=n_layer, projection_dim=n_embd_text, head_count=n_head,
                     stack_factor=stack)

    def t(name: str, *shape: int, scale: float = 0.2):
        w.add_tensor(name, (rng.standard_normal(shape) * scale).astype(np.float32))

    def filled(name: str, value: float, *shape: int):
        w.add_tensor(name, np.full(shape, value, dtype=np.float32))

    t("a.conv1d.1.weight", n_embd, n_mel, 3)
    filled("a.conv1d.1.bias", 0.0, n_embd, 1)
    t("a.conv1d.2.weight", n_embd, n_embd, 3)
    filled("a.conv1d.2.bias", 0.0, n_embd, 1)
    t("a.position_embd.weight", 1500, n_embd)
    for i in range(n_layer):
        for norm in ("ln1", "ln2"):
            filled(f"a.blk.{i}.{norm}.weight", 1.0, n_embd)
            filled(f"a.blk.{i}.{norm}.bias", 0.0, n_embd)
        for part in ("attn_q", "attn_k", "attn_v", "attn_out"):
            t(f"a.blk.{i}.{part}.weight", n_embd, n_embd)
            if part != "attn_k":  # Whisper's keys have no bias
                filled(f"a.blk.{i}.{part}.bias", 0.0, n_embd)
        t(f"a.blk.{i}.ffn_up.weight", n_ff, n_embd)
        filled(f"a.blk.{i}.ffn_up.bias", 0.0, n_ff)
        t(f"a.blk.{i}.ffn_down.weight", n_embd, n_ff)
        filled(f"a.blk.{i}.ffn_down.bias", 0.0, n_embd)
    filled("a.post_ln.weight", 1.0, n_embd)
    filled("a.post_ln.bias", 0.0, n_embd)
    filled("mm.a.norm_pre.weight", 1.0, n_embd * stack)
    t("mm.a.mlp.1.weight", 2 * hidden, n_embd * stack)
    filled("mm.a.norm_mid.weight", 1.0, hidden)
    t("mm.a.mlp.2.weight", n_embd_text, hidden)
    _write_out(w)
    return path


def write_audio_pair(directory: Path, *, n_embd: int = 64) -> tuple[Path, Path]:
    """A text model with SmolLM2's tokenizer and template and an ultravox projector made for its width."""
    directory.mkdir(parents=True, exist_ok=True)
    text = write_long_context_llama(directory / "tiny-hearing.gguf", n_ctx=4096, n_embd=n_embd)
    return text, write_ultravox_projector(directory / "mmproj-tiny-hearing.gguf", n_embd_text=n_embd)


def wav(seconds: float, frequency: float, rate: int = 16000) -> bytes:
    """A sine tone as a 16-bit mono WAV, made with the standard library."""
    import io
    import math
    import struct
    import wave

    out = io.BytesIO()
    with wave.open(out, "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(rate)
        f.writeframes(b"".join(struct.pack("<h", int(12000 * math.sin(2 * math.pi * frequency * i / rate)))
                               for i in range(int(seconds * rate))))
    return out.getvalue()


# llama.cpp's file types (llama.h's LLAMA_FTYPE_MOSTLY_*) by the names llama-quantize takes
QUANTIZE_FTYPES = {"f16": 1, "q4_0": 2, "q4_1": 3, "q8_0": 7, "q5_0": 8, "q2_k": 10, "q3_k_m": 12, "q4_k_m": 15,
                   "q5_k_m": 17, "q6_k": 18, "iq4_nl": 25, "bf16": 32}


def quantized(src: Path, dst: Path, ftype: str) -> Path:
    """`src` (an F32 GGUF) requantized by llama.cpp itself (llama_model_quantize, as llama-quantize does): the
    types and the block layouts real downloads have. K-quants need rows whose length is a multiple of 256."""
    import ctypes

    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = QUANTIZE_FTYPES[ftype]
    params.nthread = 2
    if llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params)) != 0:
        raise RuntimeError(f"llama.cpp could not quantize {src} to {ftype}")
    return dst
