#!/usr/bin/env python3
"""How llama.cpp computes a decode token beside others, per weight type: the measurement behind
host_runtime/placement/matmul_rows.py, to run again when llama.cpp changes, and on a GPU (the device check runs it
there: those kernels are not covered by the rule yet).

For each type, a small random llama (256 wide, 2 layers, byte vocabulary) quantized by llama.cpp itself, loaded
and decoded as the engine does (engine/model.py's LoadedModel in the invariant mode, engine/runner.py); each of N sequences' next
token decoded alone, then sequences 0..k-1 together for k = 2..N; per k, the largest logit difference of any row
from its own alone. Prints one JSON document: per type, the largest k whose rows all matched, the first that did
not, and what matmul_rows predicts for a decode call (its most rows; null: no bound).

    python bench/row_probe.py [--types q4_0,q4_k_m,f16] [--gpu-layers 999] [--rows 16] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.serving import cpu_flags  # noqa: E402
from host_runtime.engine.model import ContextConfig, LoadedModel  # noqa: E402
from host_runtime.engine.runner import LlamaRunner  # noqa: E402
from host_runtime.placement.matmul_rows import matrix_types, row_bounds  # noqa: E402
from host_runtime.placement.model_table import read_table  # noqa: E402
from tests.tiny_gguf import QUANTIZE_FTYPES, quantized, write_tiny_llama  # noqa: E402

PROMPT_TOKENS = 20


def probe(path: Path, gpu_layers: int, rows: int) -> dict:
    """The engine's own model and runner (its invariant mode's context, its repacking, its rule)."""
    import llama_cpp

    config = ContextConfig(n_ctx_per_seq=256, n_parallel=rows, n_batch=256, n_threads=2,
                           placement="cpu" if gpu_layers == 0 else "auto",
                           n_gpu_layers=gpu_layers if gpu_layers else None)
    model = LoadedModel(path, config)
    runner = LlamaRunner(model)
    n_vocab = model.n_vocab
    for seq in range(rows):
        runner.decode([(seq, 0, [3 + (seq * 53 + i * 7) % (n_vocab - 3) for i in range(PROMPT_TOKENS)], None)])

    def step(seqs: list[int]) -> list[np.ndarray]:
        runner.decode([(seq, PROMPT_TOKENS, [5 + seq], 0) for seq in seqs])
        out = [np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(model.ctx.ctx, j), shape=(n_vocab,)).copy()
               for j in range(len(seqs))]
        for seq in seqs:
            runner.forget(seq, PROMPT_TOKENS)
        return out

    alone = [step([seq])[0] for seq in range(rows)]
    apart = {}
    for k in range(2, rows + 1):
        together = step(list(range(k)))
        apart[k] = max(float(np.abs(together[j] - alone[j]).max()) for j in range(k))
    differing = [k for k, v in apart.items() if v > 0]
    a = model.attention
    # the rule as it would be in the invariant mode with every layer on the CPU (the GPU's: none kept)
    rule = row_bounds(matrix_types(read_table(path)), invariant=True, cpu_only=True, repacked=model.weights_repacked)
    return {"gpu_layers": gpu_layers, "max_abs_logit_difference_by_rows": apart,
            "largest_exact_rows": (differing[0] - 1) if differing else rows,
            "first_differing_rows": differing[0] if differing else None,
            "attention": f"flash {a.flash}, K {a.type_k}, V {a.type_v}", "repacked": model.weights_repacked,
            "rule_decode_rows": rule.decode_rows(), "engine_note": model.row_bounds.reason or None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--types", default="q4_0,q8_0,q4_k_m,q6_k,q2_k,f16,bf16",
                    help=f"any of {', '.join(QUANTIZE_FTYPES)}, and f32")
    ap.add_argument("--gpu-layers", type=int, default=0)
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--json", help="also write the document here")
    args = ap.parse_args()
    import llama_cpp

    work = Path(tempfile.mkdtemp(prefix="row-probe-"))
    source = write_tiny_llama(work / "f32.gguf", n_ctx=512, n_embd=256, n_layer=2, n_head=4, n_ff=512)
    doc: dict = {"bench": "row_probe", "gpu_layers": args.gpu_layers, "rows": args.rows,
                 "cpu_flags": cpu_flags(), "llama_cpp_python": llama_cpp.__version__, "types": {}}
    for name in args.types.split(","):
        path = source if name == "f32" else quantized(source, work / f"{name}.gguf", name)
        doc["types"][name] = probe(path, args.gpu_layers, args.rows)
        print(f"{name}: exact up to {doc['types'][name]['largest_exact_rows']} rows", file=sys.stderr)
    text = json.dumps(doc, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
