#!/usr/bin/env python3
"""What the prefill call's size costs at a long context (prints JSON): a conversation's next turn (APPEND new
tokens after CONTEXT cached ones, an agent's later turn) computed in calls of 128 tokens (the engine's chunk) and
of 512 (llama-server's ubatch), at each context asked,
--repeats times in alternating order, each 512 run's time paired with its repeat's 128 run as a ratio (median and
range), and its result compared with the 128-token calls': the last token's logits and the sequence's KV, byte
for byte.

The context is the engine's own in its default (batch-invariant) mode, from placement/llama_params.context_params
(a KV stream per sequence, f16 KV, no flash attention), on a random-weight model of SmolLM2-135M's shape and
quantization trained for 32,768 tokens (tests/tiny_gguf.write_long_context_llama; its work per token is the default
model's). The contexts are filled once, in ascending order.

  bench/prefill_chunks.py [--contexts 4096,8192,14336] [--repeats 3] [--append 1024] [--threads N] [--model PATH]
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
sys.path.insert(0, str(Path(__file__).resolve().parent))

from serving import cpu_flags, cpu_name, spread  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--contexts", default="14336",
                    help="tokens already in the KV cache, one or several (comma-separated, each measured in turn)")
    ap.add_argument("--repeats", type=int, default=3, help="128- and 512-token runs at each context, alternated")
    ap.add_argument("--append", type=int, default=1024, help="new tokens, a multiple of 512")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--model", type=Path, default=None, help="a GGUF (default: the SmolLM2-shaped random one)")
    args = ap.parse_args()
    contexts = sorted(int(c) for c in args.contexts.split(","))
    if args.append % 512 or any(c % 512 for c in contexts):
        ap.error("--append and each of --contexts must be multiples of 512")
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
    cparams = context_params(n_ctx_per_seq=contexts[-1] + args.append + 128, n_parallel=1, n_batch=args.append,
                             n_threads=args.threads, batch_invariant=True)
    ctx = llama_cpp.llama_init_from_model(model, cparams)
    memory = llama_cpp.llama_get_memory(ctx)
    n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
    prompt = np.random.default_rng(0).integers(100, n_vocab - 100, size=contexts[-1] + args.append).tolist()

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

    def append(context: int, call: int) -> dict:
        started = time.perf_counter()
        for at in range(context, context + args.append, call):
            decode(prompt[at:at + call], at, at + call >= context + args.append)
        seconds = time.perf_counter() - started
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, -1), shape=(n_vocab,)).tobytes()
        size = llama_cpp.llama_state_seq_get_size(ctx, 0)
        state = (ctypes.c_uint8 * size)()
        llama_cpp.llama_state_seq_get_data(ctx, state, size, 0)
        llama_cpp.llama_memory_seq_rm(memory, 0, context, -1)  # the context alone again, for the next run or fill
        return {"call_tokens": call, "seconds": round(seconds, 3),
                "logits_sha1": hashlib.sha1(logits).hexdigest(), "kv_sha1": hashlib.sha1(bytes(state)).hexdigest()}

    filled, fill_s, points = 0, 0.0, []
    for context in contexts:
        started = time.perf_counter()
        for at in range(filled, context, 512):
            decode(prompt[at:min(context, at + 512)], at, False)
        fill_s += time.perf_counter() - started
        filled = context
        # Repeats alternate the order (128 first, then 512 first), so that a drift in the machine's speed falls
        # on both; each repeat's ratio is paired.
        runs = []
        for r in range(args.repeats):
            order = (128, 512) if r % 2 == 0 else (512, 128)
            pair = {call: append(context, call) for call in order}
            runs.append({"ratio_512_vs_128": round(pair[512]["seconds"] / pair[128]["seconds"], 3),
                         **{f"seconds_{call}": pair[call]["seconds"] for call in (128, 512)},
                         "identical": pair[512]["logits_sha1"] == pair[128]["logits_sha1"]
                         and pair[512]["kv_sha1"] == pair[128]["kv_sha1"]})
        points.append({"context_tokens": context, "ratio_512_vs_128": spread([r["ratio_512_vs_128"] for r in runs]),
                       "identical": all(r["identical"] for r in runs), "runs": runs})
        print(f"bench: {context} tokens of context: 512-token calls {points[-1]['ratio_512_vs_128']} of the "
              f"128-token calls' time", file=sys.stderr)
    print(json.dumps({
        "model": str(path), "append_tokens": args.append, "threads": args.threads, "repeats": args.repeats,
        "cpu": cpu_name(), "cpu_flags": cpu_flags(), "context_fill_s": round(fill_s, 1), "contexts": points,
    }, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
