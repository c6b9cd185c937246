#!/usr/bin/env python3
"""What a KV cache type costs in quality, memory and time, against F16, in one run (prints JSON).

Quality: a fixed English text (Python's own documentation topics, `pydoc_data.topics`, the first TOKENS tokens) is
evaluated once per KV type with the same model and settings; for each position the next-token distribution is
compared with F16's: top-1 agreement, the mean KL divergence from F16, and the text's perplexity under each. Memory:
the KV bytes per token of context, by the planner's arithmetic (placement/kv_types.py), beside F16's. Time: the
prompt's evaluation, and greedy decoding of DECODE tokens after it, per token, as ratios to F16's.

Each type runs with the per-row flash attention the engine's invariant mode takes on the CPU with several short
sequences or speculation (placement/kv_types.attention_layout: F16 stored as K BF16 and V F16, or both BF16 where
ggml's F16 vectors are AVX512-FP16's); the reference is
F16 with plain attention (the invariant mode's other layout, and the quality baseline every row is compared
with). A type is a name for both K and V (`q8_0`) or a K/V pair (`bf16/f16`).

`--mode mixed` runs each type with the attention the mixed-batches mode gives it instead (llama.cpp's own choice,
as llama-server's: for F16 K and V its tiled kernel for prompts and its split over the cells for one query row at
512 cells or more; for a quantized type the same one-row-at-a-time kernel as the invariant mode, the only one this
llama.cpp's CPU backend has for it), with the time ratios also against that mode's `f16`.

  bench/kv_cache.py [--model PATH] [--tokens 2048] [--decode 64] [--types f16,q8_0,q4_0] [--threads N]
                    [--mode invariant|mixed]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def fixed_text() -> str:
    from pydoc_data.topics import topics

    return "\n\n".join(topics[k] for k in sorted(topics))


def log_softmax(row):
    import numpy as np

    row = row.astype(np.float64)
    m = row.max()
    return row - m - math.log(np.exp(row - m).sum())


REFERENCE = "f16 plain"  # F16 K and V, no flash attention


def layout_of(kv: str, mode: str = "invariant"):
    """The attention and stored types a type (`q8_0`, `bf16/f16`, or REFERENCE) runs with here, in this batching
    mode."""
    from host_runtime.placement.kv_types import AttentionLayout, attention_layout
    from host_runtime.placement.llama_params import f16_wide_vectors

    if kv == REFERENCE:
        return AttentionLayout("invariant", "off", "f16", "f16", "the reference")
    k, _, v = kv.partition("/")
    return attention_layout((k, v or k), batch_invariant=mode == "invariant", cpu_only=True, speculation=True,
                            f16_wide_vectors=f16_wide_vectors())


def _weights_as_the_engine_loads_them() -> None:
    """llama_cpp.Llama takes no use_extra_bufts: its model parameters get the engine's (placement/llama_params.py),
    without which a native build with AMX segfaulted here in the first batched decode (seen on a 2-core Xeon)."""
    import llama_cpp.llama_cpp as low

    from host_runtime.placement.llama_params import extra_buffers_safe

    default = low.llama_model_default_params

    def engine_params():
        params = default()
        params.use_extra_bufts = extra_buffers_safe()
        return params

    low.llama_model_default_params = engine_params


def run_type(model_path: str, tokens: list[int], kv: str, n_decode: int, threads: int, mode: str = "invariant"):
    import llama_cpp
    import numpy as np

    from host_runtime.placement.kv_types import kv_type

    layout = layout_of(kv, mode)
    n_ctx = len(tokens) + n_decode + 16
    llm = llama_cpp.Llama(model_path=model_path, n_ctx=n_ctx, n_batch=512, n_ubatch=512, n_threads=threads,
                          n_threads_batch=threads, logits_all=True, verbose=False,
                          type_k=kv_type(layout.type_k).ggml_type, type_v=kv_type(layout.type_v).ggml_type,
                          flash_attn=layout.flash in ("on", "auto"))  # auto: llama.cpp takes it on the CPU
    started = time.perf_counter()
    llm.eval(tokens)
    prompt_s = time.perf_counter() - started
    logits = np.array(llm.scores[: len(tokens)], dtype=np.float32)
    # Greedy decoding after the prompt: one token a call, the context full of the prompt.
    started = time.perf_counter()
    for _ in range(n_decode):
        token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        llm.eval([token])
    decode_s = time.perf_counter() - started
    del llm
    return layout, logits, prompt_s, decode_s


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="GGUF (default: the embedded SmolLM2-135M-Instruct)")
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--types", default="f16,q8_0,q4_0")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--mode", choices=("invariant", "mixed"), default="invariant",
                    help="the batching mode whose attention each type runs with (the reference is the same)")
    args = ap.parse_args(argv)
    _weights_as_the_engine_loads_them()  # once: every model this run loads

    import llama_cpp
    import numpy as np

    from host_runtime.engine.model import default_model_path
    from host_runtime.placement.model_table import read_table

    model_path = args.model or str(default_model_path())
    vocab_model = llama_cpp.Llama(model_path=model_path, vocab_only=True, verbose=False)
    tokens = vocab_model.tokenize(fixed_text().encode(), add_bos=True)[: args.tokens]
    del vocab_model
    table = read_table(model_path)
    types = [REFERENCE] + [t for t in args.types.split(",") if t]
    results: dict = {}
    reference = None
    for kv in types:
        layout, logits, prompt_s, decode_s = run_type(model_path, tokens, kv, args.decode, args.threads, args.mode)
        logp = np.stack([log_softmax(row) for row in logits[:-1]])
        targets = np.array(tokens[1:])
        nll = -logp[np.arange(len(targets)), targets].mean()
        entry = {"attention": f"flash {layout.flash}, K {layout.type_k}, V {layout.type_v}",
                 "kv_bytes_per_token": table.kv_bytes_per_token((layout.type_k, layout.type_v)),
                 "perplexity": round(float(math.exp(nll)), 4),
                 "prompt_s": round(prompt_s, 3), "decode_ms_per_token": round(decode_s / args.decode * 1000, 3)}
        if reference is None:
            reference = logp
        else:
            top1 = float((logp.argmax(axis=1) == reference.argmax(axis=1)).mean())
            kl = float((np.exp(reference) * (reference - logp)).sum(axis=1).mean())
            entry |= {"top1_agreement_vs_reference": round(top1, 4), "mean_kl_vs_reference": round(kl, 6)}
        results[kv] = entry
    base = results[REFERENCE]
    ratios = {kv: {"kv_bytes_vs_reference": round(r["kv_bytes_per_token"] / base["kv_bytes_per_token"], 4),
                   "prompt_time_vs_reference": round(r["prompt_s"] / base["prompt_s"], 3),
                   "decode_time_vs_reference": round(r["decode_ms_per_token"] / base["decode_ms_per_token"], 3)}
              for kv, r in results.items() if kv != REFERENCE}
    f16 = results.get("f16")
    if f16:  # against the same mode's F16 too: what choosing the type costs there
        for kv, r in results.items():
            if kv not in (REFERENCE, "f16"):
                ratios[kv] |= {"prompt_time_vs_f16": round(r["prompt_s"] / f16["prompt_s"], 3),
                               "decode_time_vs_f16": round(r["decode_ms_per_token"] / f16["decode_ms_per_token"], 3)}
    print(json.dumps({"model": Path(model_path).name, "text": "pydoc_data.topics", "tokens": len(tokens),
                      "decode_tokens": args.decode, "threads": args.threads, "mode": args.mode, "reference": "F16 K and V, plain attention",
                      "types": results, "ratios": ratios},
                     indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
