#!/usr/bin/env python3
"""What the prefill call's size costs at a long context (prints JSON): a conversation's next turn (APPEND new
tokens after CONTEXT cached ones, an agent's later turn) computed in calls of 128 tokens (the engine's chunk, its
prefix cache's and its invariance's cut unit), of 512 and of APPEND, each timed and compared with the 128-token
calls' result: the last token's logits and the sequence's KV, byte for byte.

The context is the engine's own in its default (batch-invariant) mode, from placement/llama_params.context_params
(a KV stream per sequence, f16 KV, no flash attention), on a random-weight model of SmolLM2-135M's shape and
quantization trained for 32,768 tokens (tests/tiny_gguf.write_long_context_llama; its work per token is the default
model's). The 128-token calls run first and last: their spread is the run's noise.

  bench/prefill_chunks.py [--context 14336] [--append 1024] [--threads N] [--model PATH]
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--context", type=int, default=14336, help="tokens already in the KV cache")
    ap.add_argument("--append", type=int, default=1024, help="new tokens, a multiple of 512")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--model", type=Path, default=None, help="a GGUF (default: the SmolLM2-shaped random one)")
    args = ap.parse_args()
    if args.append % 512 or args.context % 128:
        ap.error("--append must be a multiple of 512 and --context of 128")
    import llama_cpp
    import numpy as np

    from host_runtime.placement.llama_params import context_params
    from tests.tiny_gguf import write_long_context_llama

    path = args.model
    if path is None:
        path = Path(os.environ.get("TMPDIR", "/tmp")) / "everycycle-bench-long-smollm2.gguf"
        if not path.exists():
            write_long_context_llama(path, n_ctx=32768, n_embd=576, n_layer=30, n_head=9, n_head_kv=3, n_ff=1536,
                                     matrix_type="q4_1")
    llama_cpp.llama_backend_init()
    mparams = llama_cpp.llama_model_default_params()
    mparams.n_gpu_layers = 0
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), mparams)
    cparams = context_params(n_ctx_per_seq=args.context + args.append + 128, n_parallel=1, n_batch=args.append,
                             n_threads=args.threads, batch_invariant=True)
    ctx = llama_cpp.llama_init_from_model(model, cparams)
    memory = llama_cpp.llama_get_memory(ctx)
    n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
    prompt = np.random.default_rng(0).integers(100, n_vocab - 100, size=args.context + args.append).tolist()

    def decode(tokens: list[int], first: int, want_logits: bool) -> None:
        batch = llama_cpp.llama_batch_init(len(tokens), 0, 1)
        for i, token in enumerate(tokens):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, first + i, 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = 1 if want_logits and i == len(tokens) - 1 else 0
        batch.n_tokens = len(tokens)
        rc = llama_cpp.llama_decode(ctx, batch)
        llama_cpp.llama_batch_free(batch)
        if rc != 0:
            raise SystemExit(f"llama_decode returned {rc}")

    started = time.perf_counter()
    for at in range(0, args.context, 512):
        decode(prompt[at:min(args.context, at + 512)], at, False)
    context_s = time.perf_counter() - started
    runs = []
    for call in (128, 512, args.append, 128):
        llama_cpp.llama_memory_seq_rm(memory, 0, args.context, -1)
        started = time.perf_counter()
        for at in range(args.context, args.context + args.append, call):
            decode(prompt[at:at + call], at, at + call >= args.context + args.append)
        seconds = time.perf_counter() - started
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, -1), shape=(n_vocab,)).tobytes()
        size = llama_cpp.llama_state_seq_get_size(ctx, 0)
        state = (ctypes.c_uint8 * size)()
        llama_cpp.llama_state_seq_get_data(ctx, state, size, 0)
        runs.append({"call_tokens": call, "seconds": round(seconds, 3),
                     "logits_sha1": hashlib.sha1(logits).hexdigest(), "kv_sha1": hashlib.sha1(bytes(state)).hexdigest()})
    base = sorted(r["seconds"] for r in runs if r["call_tokens"] == 128)
    reference = runs[0]
    print(json.dumps({
        "model": str(path), "context_tokens": args.context, "append_tokens": args.append, "threads": args.threads,
        "context_fill_s": round(context_s, 1), "runs": runs,
        "ratios_vs_128": {str(r["call_tokens"]): round(r["seconds"] / (sum(base) / len(base)), 3)
                          for r in runs[1:3]},
        "noise_128": round(base[-1] / base[0], 3),
        "identical_to_128": all(r["logits_sha1"] == reference["logits_sha1"] and r["kv_sha1"] == reference["kv_sha1"]
                                for r in runs),
    }, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
