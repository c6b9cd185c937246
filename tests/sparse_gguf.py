"""Sparse GGUFs of real mixture-of-experts shapes: the metadata and tensor table of a published model, no weights.

The file has the real file's size (a hole where the data would be, so it takes no disk), which is all the
placement planner reads. Shapes follow llama.cpp's loader for each architecture (llama-model.cpp); the quant
types are said beside each model, chosen so the file's size is the published file's to a few percent.
"""

from __future__ import annotations

import os
from pathlib import Path

from host_runtime.placement.model_table import ggml_nbytes

GIB = 1 << 30


def write_sparse(path: Path, arch: str, name: str, hparams: dict, tensors: list[tuple[str, tuple[int, ...], object]]) -> Path:
    """hparams: GGUF keys below the architecture (block_count, ...) with int or float values; tensors: (name,
    shape in ggml's order, GGMLQuantizationType)."""
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(name)
    for key, value in hparams.items():
        if isinstance(value, float):
            w.add_float32(f"{arch}.{key}", value)
        else:
            w.add_uint32(f"{arch}.{key}", int(value))
    data = 0
    for tname, shape, ty in tensors:
        nbytes = ggml_nbytes(ty, shape)
        if ty == gguf.GGMLQuantizationType.F32:
            w.add_tensor_info(tname, tuple(reversed(shape)), np.dtype(np.float32), nbytes, raw_dtype=ty)
        else:  # the writer takes a quantized tensor's shape in bytes, a row's bytes last
            block, size = gguf.GGML_QUANT_SIZES[ty]
            rows = tuple(reversed(shape[1:])) + (shape[0] // block * size,)
            w.add_tensor_info(tname, rows, np.dtype(np.uint8), nbytes, raw_dtype=ty)
        data += gguf.GGUFWriter.ggml_pad(nbytes, w.data_alignment)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    header = os.path.getsize(path)
    os.truncate(path, gguf.GGUFWriter.ggml_pad(header, w.data_alignment) + data)
    return path


def _more_bits(i: int, n_layer: int) -> bool:
    """llama-quant.cpp's use_more_bits: the layers whose ffn_down Q4_K_M keeps in Q6_K."""
    return i < n_layer // 8 or i >= 7 * n_layer // 8 or (i - n_layer // 8) % 3 == 2


def qwen3_30b_a3b(path: Path) -> Path:
    """Qwen3-30B-A3B (48 layers, 128 experts of which 8 a token, 32 query and 4 KV heads of 128) at about
    Q4_K_M: Q4_K for most matrices, Q6_K for attn_v, the head and the experts' down projection in the layers
    llama.cpp's Q4_K_M gives more bits (18.6 GB, as published)."""
    import gguf

    Q = gguf.GGMLQuantizationType
    n_layer, n_embd, n_head, n_kv, hd, n_expert, n_ff_exp, n_vocab = 48, 2048, 32, 4, 128, 128, 768, 151936
    t: list = [("token_embd.weight", (n_embd, n_vocab), Q.Q4_K)]
    for i in range(n_layer):
        b = f"blk.{i}."
        t += [(b + "attn_norm.weight", (n_embd,), Q.F32), (b + "attn_q.weight", (n_embd, n_head * hd), Q.Q4_K),
              (b + "attn_k.weight", (n_embd, n_kv * hd), Q.Q4_K), (b + "attn_v.weight", (n_embd, n_kv * hd), Q.Q6_K),
              (b + "attn_output.weight", (n_head * hd, n_embd), Q.Q4_K), (b + "attn_q_norm.weight", (hd,), Q.F32),
              (b + "attn_k_norm.weight", (hd,), Q.F32), (b + "ffn_norm.weight", (n_embd,), Q.F32),
              (b + "ffn_gate_inp.weight", (n_embd, n_expert), Q.F32),
              (b + "ffn_gate_exps.weight", (n_embd, n_ff_exp, n_expert), Q.Q4_K),
              (b + "ffn_up_exps.weight", (n_embd, n_ff_exp, n_expert), Q.Q4_K),
              (b + "ffn_down_exps.weight", (n_ff_exp, n_embd, n_expert), Q.Q6_K if _more_bits(i, n_layer) else Q.Q4_K)]
    t += [("output_norm.weight", (n_embd,), Q.F32), ("output.weight", (n_embd, n_vocab), Q.Q6_K)]
    hp = {"block_count": n_layer, "context_length": 40960, "embedding_length": n_embd, "feed_forward_length": 6144,
          "attention.head_count": n_head, "attention.head_count_kv": n_kv, "attention.key_length": hd,
          "attention.value_length": hd, "expert_count": n_expert, "expert_used_count": 8,
          "expert_feed_forward_length": n_ff_exp, "rope.freq_base": 1e6, "attention.layer_norm_rms_epsilon": 1e-6}
    return write_sparse(path, "qwen3moe", "Qwen3-30B-A3B-Q4_K_M", hp, t)


def gpt_oss_120b(path: Path) -> Path:
    """gpt-oss-120b (36 layers, 128 experts of which 4 a token, 64 query and 8 KV heads of 64, every other layer
    a 128-token sliding window) as published in MXFP4: the experts in MXFP4, the other matrices in Q8_0, norms,
    biases and sinks in F32 (about 63 GB)."""
    import gguf

    Q = gguf.GGMLQuantizationType
    n_layer, n_embd, n_head, n_kv, hd, n_expert, n_ff_exp, n_vocab = 36, 2880, 64, 8, 64, 128, 2880, 201088
    t: list = [("token_embd.weight", (n_embd, n_vocab), Q.Q8_0)]
    for i in range(n_layer):
        b = f"blk.{i}."
        t += [(b + "attn_norm.weight", (n_embd,), Q.F32), (b + "post_attention_norm.weight", (n_embd,), Q.F32),
              (b + "attn_q.weight", (n_embd, n_head * hd), Q.Q8_0), (b + "attn_q.bias", (n_head * hd,), Q.F32),
              (b + "attn_k.weight", (n_embd, n_kv * hd), Q.Q8_0), (b + "attn_k.bias", (n_kv * hd,), Q.F32),
              (b + "attn_v.weight", (n_embd, n_kv * hd), Q.Q8_0), (b + "attn_v.bias", (n_kv * hd,), Q.F32),
              (b + "attn_output.weight", (n_head * hd, n_embd), Q.Q8_0), (b + "attn_output.bias", (n_embd,), Q.F32),
              (b + "attn_sinks.weight", (n_head,), Q.F32),
              (b + "ffn_gate_inp.weight", (n_embd, n_expert), Q.F32), (b + "ffn_gate_inp.bias", (n_expert,), Q.F32),
              (b + "ffn_gate_exps.weight", (n_embd, n_ff_exp, n_expert), Q.MXFP4),
              (b + "ffn_gate_exps.bias", (n_ff_exp, n_expert), Q.F32),
              (b + "ffn_up_exps.weight", (n_embd, n_ff_exp, n_expert), Q.MXFP4),
              (b + "ffn_up_exps.bias", (n_ff_exp, n_expert), Q.F32),
              (b + "ffn_down_exps.weight", (n_ff_exp, n_embd, n_expert), Q.MXFP4),
              (b + "ffn_down_exps.bias", (n_embd, n_expert), Q.F32)]
    t += [("output_norm.weight", (n_embd,), Q.F32), ("output.weight", (n_embd, n_vocab), Q.Q8_0)]
    hp = {"block_count": n_layer, "context_length": 131072, "embedding_length": n_embd,
          "feed_forward_length": n_ff_exp, "attention.head_count": n_head, "attention.head_count_kv": n_kv,
          "attention.key_length": hd, "attention.value_length": hd, "attention.sliding_window": 128,
          "expert_count": n_expert, "expert_used_count": 4, "expert_feed_forward_length": n_ff_exp}
    return write_sparse(path, "gpt-oss", "gpt-oss-120b-MXFP4", hp, t)
