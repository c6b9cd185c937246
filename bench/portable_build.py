"""What the image's portable llama.cpp build costs, beside the native build in the same run.

The image ships llama-cpp-python built with GGML_NATIVE=OFF (AVX2/FMA/F16C, so it runs on any
x86-64 box from Haswell/Zen on); `make run` builds natively for the machine it is on. This loads
the same model through each build's libraries (LLAMA_CPP_LIB_PATH), alternating A/B, and prints
JSON: prompt processing and generation tokens/s for each, and portable/native as ratios.

  .venv/bin/python bench/portable_build.py [--portable-lib DIR] [--repeats 3]

DIR defaults to the lib directory of the wheel image/build-wheels.sh built (unpacked to a cache).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import zipfile
from pathlib import Path

WHEEL_CACHE = Path(os.environ.get("EVERYCYCLE_WHEEL_CACHE", Path.home() / ".cache/everycycle/wheels"))

# Runs in a child process, so that each build's shared libraries are loaded fresh.
CHILD = r"""
import json, os, sys, time
import llama_cpp
from host_runtime.engine.model import default_model_path
prompt_tokens, gen_tokens, threads = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
llm = llama_cpp.Llama(str(default_model_path()), n_ctx=prompt_tokens + gen_tokens + 16, n_batch=prompt_tokens,
                      n_threads=threads, n_threads_batch=threads, verbose=False)
text = " ".join(["the quick brown fox jumps over the lazy dog"] * (prompt_tokens // 8))
tokens = llm.tokenize(text.encode())[:prompt_tokens]
llm.eval(tokens[:8]); llm.reset()  # warm the weights and the kernels
t0 = time.perf_counter(); llm.eval(tokens); t1 = time.perf_counter()
for _ in range(gen_tokens):
    llm.eval([llm.sample(temp=0.0)])
t2 = time.perf_counter()
info = llama_cpp.llama_print_system_info().decode()
print(json.dumps({"prompt_tps": len(tokens) / (t1 - t0), "gen_tps": gen_tokens / (t2 - t1), "system_info": info}))
"""


def portable_lib_dir() -> Path:
    wheels = sorted(WHEEL_CACHE.glob("llama-cpp-python-*/llama_cpp_python-*.whl"), key=lambda p: p.stat().st_mtime)
    if not wheels:
        sys.exit(f"portable_build: no portable wheel under {WHEEL_CACHE}: run image/build-wheels.sh first")
    wheel = wheels[-1]
    dest = wheel.parent / "unpacked"
    if not (dest / "llama_cpp/lib/libllama.so").exists():
        with zipfile.ZipFile(wheel) as z:
            z.extractall(dest)
    return dest / "llama_cpp/lib"


def run_once(lib_dir: Path | None, args) -> dict:
    env = dict(os.environ)
    env.pop("LLAMA_CPP_LIB_PATH", None)
    if lib_dir is not None:
        env["LLAMA_CPP_LIB_PATH"] = str(lib_dir)
    out = subprocess.run([sys.executable, "-c", CHILD, str(args.prompt_tokens), str(args.gen_tokens), str(args.threads)],
                         capture_output=True, text=True, env=env, timeout=600)
    if out.returncode != 0:
        sys.exit(f"portable_build: the benchmark child failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--portable-lib", type=Path, help="the portable build's llama_cpp/lib directory")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    args = ap.parse_args()
    portable = args.portable_lib or portable_lib_dir()
    runs: dict[str, list[dict]] = {"native": [], "portable": []}
    for _ in range(args.repeats):  # alternate, so drift on the machine hits both alike
        runs["native"].append(run_once(None, args))
        runs["portable"].append(run_once(portable, args))
    result = {"model": "SmolLM2-135M-Instruct (default)", "threads": args.threads, "repeats": args.repeats,
              "prompt_tokens": args.prompt_tokens, "gen_tokens": args.gen_tokens, "portable_lib": str(portable)}
    for name, rs in runs.items():
        result[name] = {"prompt_tps": round(statistics.median(r["prompt_tps"] for r in rs), 1),
                        "gen_tps": round(statistics.median(r["gen_tps"] for r in rs), 1),
                        "system_info": rs[0]["system_info"].strip()}
    result["ratio_portable_over_native"] = {
        k: round(result["portable"][k] / result["native"][k], 3) for k in ("prompt_tps", "gen_tps")}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
