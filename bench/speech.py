#!/usr/bin/env python3
"""Speech-to-text engines side by side on this machine (prints JSON): whisper.cpp (pywhispercpp, the engine the
box runs for Whisper models) against faster-whisper (CTranslate2), each in a process of its own, per model size,
repeats alternated. Each run: a random-weight Whisper of the size's real shape, 30 s of sound with the decoder
held to 1 token (the window's encode) and to 100 tokens; the real-time factor at 100 tokens per 30 s (the
transcript of a half-minute's speech) is (encode + 100 x per-token) / 30: below 1 is faster than real time.
Reported per size: each engine's figures (median and spread) and whisper.cpp's as a ratio to faster-whisper's.

faster-whisper needs torch and transformers (they write its random model): give a Python that has them with
--reference-python (left out: whisper.cpp alone).

  bench/speech.py [--sizes base,small] [--repeats 3] [--reference-python PATH] [--cache DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from serving import cpu_flags, cpu_name, spread  # noqa: E402

FIGURES = ("encode_30s_s", "decode_s_per_token", "rtf_at_100_tokens", "resident_mib", "load_s")


def one_run(python: str, engine: str, size: str, cache: Path, threads: int) -> dict:
    out = subprocess.run([python, str(HERE / "speech_engine.py"), "--engine", engine, "--size", size, "--cache",
                          str(cache), "--threads", str(threads)], capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise SystemExit(f"{engine} {size} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="base,small")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    p.add_argument("--reference-python", help="a Python with faster-whisper, torch and transformers")
    p.add_argument("--cache", type=Path, help="where the random models are kept between runs (default: a temporary "
                                              "folder)")
    args = p.parse_args()
    cache = args.cache or Path(tempfile.mkdtemp(prefix="speech-bench-"))
    engines = [("whisper.cpp", sys.executable)]
    if args.reference_python:
        engines.append(("faster-whisper", args.reference_python))
    result = {"bench": "speech", "date": time.strftime("%Y-%m-%d"), "cpu": cpu_name(), "cpu_flags": cpu_flags(),
              "cores": os.cpu_count(), "threads": args.threads, "machine": platform.machine(),
              "repeats": args.repeats, "window_s": 30, "sizes": {}}
    for size in args.sizes.split(","):
        runs: dict[str, list[dict]] = {name: [] for name, _ in engines}
        for repeat in range(args.repeats):
            order = engines if repeat % 2 == 0 else engines[::-1]
            for name, python in order:
                runs[name].append(one_run(python, name, size, cache, args.threads))
                print(f"{size} {name} #{repeat + 1}: {runs[name][-1]}", file=sys.stderr, flush=True)
        row: dict = {name: {figure: spread([r[figure] for r in rs]) for figure in FIGURES}
                     for name, rs in runs.items()}
        for name in runs:
            row[name]["tokens_decoded"] = [r["tokens_decoded"] for r in runs[name]]
        if len(engines) == 2:
            row["whisper_cpp_vs_faster_whisper"] = {
                figure: spread([a[figure] / b[figure] for a, b in zip(runs["whisper.cpp"], runs["faster-whisper"])
                                if b[figure]]) for figure in ("encode_30s_s", "decode_s_per_token",
                                                               "rtf_at_100_tokens", "resident_mib")}
        result["sizes"][size] = row
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
