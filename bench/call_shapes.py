#!/usr/bin/env python3
"""What one decode call costs in-process, by attention layout and call shape (prints JSON): the engine's own
model and runner (engine/model.LoadedModel, engine/runner.LlamaRunner), 16 sequences of 100 tokens each, then,
alternated round by round, per layout:

- decode16: one token of each of the 16 sequences in one call; decode1: one token of one sequence;
- prompt84: an 84-token prompt after 25 cached tokens (the serving bench's chat turn);
- step: 15 sequences' next tokens and that prompt in one call (a step that admits a request), beside
  decode15 (the 15 tokens alone): with a KV stream per sequence llama.cpp splits such a call into a pass of one
  token a sequence and a pass of the prompt's rest; with one unified cache it is one pass.

Layouts: the invariant mode's per-row flash attention with K as BF16 (V F16, or both BF16), each sequence its
own KV stream; and llama.cpp's own choice of kernels over one unified cache (the mixed-batches mode: for F16 K
and V its tiled and split kernels), with F16 K and V or with the per-row layout's types. (llama-server keeps a
unified cache only where --parallel is left to auto; with -np N, as bench/serving.py starts it, a stream a slot.)
Medians over --rounds, and each layout's ratio to the first one's, round by round (median, min, max).

  bench/call_shapes.py [--rounds 9] [--threads N] [--model PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.serving import cpu_flags, cpu_name, spread  # noqa: E402

N_SEQ, PROMPT, STEPS = 16, 100, 8
TURN = list(range(900, 984))  # the 84-token prompt, after CACHED tokens of its sequence
CACHED = 25

# name -> ContextConfig's settings beside the shared ones
LAYOUTS = {
    "per-row K bf16 V f16 (invariant)": {"cache_type_k": "bf16", "cache_type_v": "f16"},
    "per-row K bf16 V bf16 (invariant)": {"cache_type_k": "bf16", "cache_type_v": "bf16"},
    "llama.cpp's own, f16 (mixed)": {"batch_invariant": False},
    "llama.cpp's own, K bf16 V f16 (mixed)": {"batch_invariant": False, "cache_type_k": "bf16",
                                              "cache_type_v": "f16"},
}


def filled(path: str, settings: dict, threads: int):
    from host_runtime.engine.model import ContextConfig, LoadedModel
    from host_runtime.engine.runner import LlamaRunner

    model = LoadedModel(path, ContextConfig(n_ctx_per_seq=1024, n_parallel=N_SEQ, n_threads=threads, **settings))
    runner = LlamaRunner(model)
    for seq in range(N_SEQ):
        runner.decode([(seq, 0, prompt_of(seq), None)])
    return model, runner


def prompt_of(seq: int) -> list[int]:
    return [100 + (seq * 31 + i * 7) % 20000 for i in range(PROMPT)]


def trim(runner) -> None:
    """Every sequence back to its PROMPT tokens, the last to its CACHED ones (where its next turn starts)."""
    for seq in range(N_SEQ - 1):
        runner.forget(seq, PROMPT)
    runner.forget(N_SEQ - 1, CACHED)


def timed(runner, parts) -> float:
    """One decode call's milliseconds."""
    started = time.perf_counter()
    runner.decode(parts)
    return (time.perf_counter() - started) * 1e3


def one_round(runner) -> dict[str, float]:
    out = {}
    steps = []
    for j in range(STEPS):
        steps.append(timed(runner, [(s, PROMPT + j, [500 + j + s], 0) for s in range(N_SEQ)]))
    out["decode16"] = statistics.median(steps)
    steps = []
    for j in range(STEPS):
        steps.append(timed(runner, [(0, PROMPT + STEPS + j, [700 + j], 0)]))
    out["decode1"] = statistics.median(steps)
    last = N_SEQ - 1
    for what in ("decode15", "prompt84", "step"):
        trim(runner)
        parts = [] if what == "prompt84" else [(s, PROMPT, [600 + s], 0) for s in range(last)]
        if what != "decode15":
            parts.append((last, CACHED, TURN, len(TURN) - 1))
        out[what] = timed(runner, parts)
    trim(runner)  # and the last's turn again: the PROMPT tokens each that every round starts from
    runner.decode([(last, CACHED, prompt_of(last)[CACHED:], None)])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--model", help="a GGUF (default: the default model)")
    args = ap.parse_args()
    from host_runtime.engine.model import default_model_path

    path = args.model or str(default_model_path())
    loaded = {}
    for name, settings in LAYOUTS.items():
        model, runner = filled(path, settings, args.threads)
        a = model.attention
        loaded[name] = runner
        print(f"{name}: flash {a.flash}, K {a.type_k}, V {a.type_v}", file=sys.stderr)
    raw: dict[str, dict[str, list[float]]] = {name: {} for name in LAYOUTS}
    for k in range(args.rounds):  # alternated: a slow stretch of the machine falls on every layout
        for name in (list(LAYOUTS) if k % 2 == 0 else list(LAYOUTS)[::-1]):
            for what, ms in one_round(loaded[name]).items():
                raw[name].setdefault(what, []).append(ms)
    first = next(iter(LAYOUTS))
    doc = {"bench": "call_shapes", "cpu": cpu_name(), "cpu_flags": cpu_flags(), "threads": args.threads,
           "model": Path(path).name, "sequences": N_SEQ, "tokens_each": PROMPT, "rounds": args.rounds,
           "medians_ms": {name: {w: round(statistics.median(v), 2) for w, v in d.items()} for name, d in raw.items()},
           f"vs_{first}": {name: {w: spread([a / b for a, b in zip(v, raw[first][w])]) for w, v in d.items()}
                           for name, d in raw.items() if name != first},
           "raw_ms": raw}
    print(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
