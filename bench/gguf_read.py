#!/usr/bin/env python3
"""Reading a GGUF's tensor table for the planner: ggml's own reader (host_runtime/placement/gguf_c.py) against the
`gguf` package's GGUFReader, the named reference, on the same file in the same run. Prints one JSON document:
median seconds of each over --repeats alternated runs, and the ratio.

  python bench/gguf_read.py [--model PATH] [--repeats 5]     (default: the built-in SmolLM2 GGUF)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> int:
    from host_runtime.engine.model import default_model_path
    from host_runtime.placement.model_table import _read_table_gguf_package, read_table

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    path = args.model or default_model_path()
    times = {"ggml": [], "gguf_package": []}
    for _ in range(args.repeats):  # alternated, so that a slow moment of the machine hits both
        for name, read in (("ggml", read_table), ("gguf_package", _read_table_gguf_package)):
            started = time.perf_counter()
            table = read(path)
            times[name].append(time.perf_counter() - started)
    medians = {name: statistics.median(v) for name, v in times.items()}
    print(json.dumps({"model": str(path), "file_bytes": path.stat().st_size, "layers": table.n_layer,
                      "repeats": args.repeats, "median_s": medians,
                      "ratios": {"ggml_speedup_vs_gguf_package": medians["gguf_package"] / medians["ggml"]}},
                     indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
