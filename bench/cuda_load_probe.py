"""Which import before a model load breaks it on a CUDA build (the first H200 session: the engine's placement dry
run crashed in llama.cpp's tokenizer regex, `everycycle plan` with the same placement did not). Each variant runs
`everycycle plan` for the default model fully offloaded in a fresh process after importing one more thing; prints
one JSON document (variant -> exit code and the last lines of a crash). bench/device_run.sh check runs it first.

    python bench/cuda_load_probe.py [--out DIR]
(Here, without a GPU: GGML_VK_VISIBLE_DEVICES=0 puts the plan on lavapipe; a module not installed exits 1.)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PLAN = ["plan", "--gpu-layers", "999", "--ctx-size", "1024", "--parallel", "64", "--json"]
# What the engine process has imported by the time it loads a model, and `plan` has not, one at a time.
VARIANTS = {
    "plan alone": "",
    "after the engine's modules": "import host_runtime.engine.service",
    "after the gguf package": "import gguf",
    "after sentencepiece": "import sentencepiece",
    "after jinja2 and falcon": "import jinja2, falcon",
    "after llama_cpp's grammar": "import llama_cpp.llama_grammar",
}


def run(first: str) -> dict:
    code = (f"{first}\nimport sys\nfrom host_runtime import cli\nsys.exit(cli.main({PLAN!r}))" if first
            else f"import sys\nfrom host_runtime import cli\nsys.exit(cli.main({PLAN!r}))")
    out = subprocess.run([sys.executable, "-X", "faulthandler", "-c", code], cwd=REPO, capture_output=True,
                         text=True, timeout=120)
    lines = [line for line in out.stderr.splitlines() if line.strip() and not line.startswith(("llama_", "load"))]
    return {"exit": out.returncode, **({"tail": lines[-12:]} if out.returncode else {})}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", metavar="DIR", help="also write cuda_load_probe.json here")
    args = ap.parse_args()
    doc = {name: run(first) for name, first in VARIANTS.items()}
    text = json.dumps(doc, indent=1)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "cuda_load_probe.json").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
