#!/usr/bin/env python3
"""The device check: on a machine with a GPU, serve a model fully offloaded in both batching modes, benchmark it
against llama-server's build for the same backend, record the NVML readings as a discovery fixture, and run the
governor observe-only under that load. Prints one JSON document. Never changes a GPU setting.

    bench/gpu_check.sh --backend cuda --llama-server PATH --write-model llama3.1-8b   (the lent NVIDIA machine)
    bench/gpu_check.sh --backend vulkan                        (CI: Mesa's lavapipe, so this cannot rot)

--write-model writes a random-weight GGUF of that architecture at Q4_K_M here first (bench/random_gguf.py:
13 s for Llama 3.1 8B's 4.6 GiB on the 2-core CPU machine); without it, the default model.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def run_json(argv: list[str], env: dict, timeout: float) -> tuple[dict | None, str]:
    out = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    try:
        return json.loads(out.stdout), out.stderr[-2000:]
    except ValueError:
        return None, (out.stdout + out.stderr)[-2000:]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", choices=["cuda", "vulkan"], required=True)
    ap.add_argument("--llama-server", help="llama-server built for the same backend (the reference); none: no reference")
    ap.add_argument("--levels", default="1,8,16,64")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--write-model", metavar="SHAPE", help="a random-weight model of this architecture (bench/random_gguf.py)")
    ap.add_argument("--servers", default="everycycle,everycycle-mixed",
                    help="bench/serving.py's servers besides llama-server (default: both batching modes)")
    ap.add_argument("--governor-seconds", type=float, default=60.0, help="how long the governor observes (default 60)")
    ap.add_argument("--out", metavar="DIR", help="also write the JSON and the NVML fixture here")
    ap.add_argument("--row-probe-types", default="q4_0,q4_k_m,f16",
                    help="bench/row_probe.py's weight types on the GPU: where a decode token beside others computes as "
                         "alone (the invariant mode's question; empty: skipped)")
    ap.add_argument("--row-probe-rows", type=int, default=16)
    args = ap.parse_args()

    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if args.backend == "vulkan":
        env.setdefault("GGML_VK_VISIBLE_DEVICES", "0")  # lavapipe, a CPU-type device, is used only when named
    py = sys.executable
    work = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    doc: dict = {"backend": args.backend, "started_unix": int(time.time())}

    devices, err = run_json([py, "-c", "import json; from host_runtime.gpu.llama_devices import list_devices, "
                             "compiled_backends; print(json.dumps({'backends': compiled_backends(), "
                             "'devices': [d.to_json() for d in list_devices()]}))"], env, 120)
    doc["llama"] = devices or {"error": err}
    wanted = "CUDA" if args.backend == "cuda" else "Vulkan"
    if not devices or not any(d["backend"] == wanted for d in devices["devices"]):
        doc["ok"] = False
        doc["reason"] = f"no {wanted} device in this llama.cpp build's list"
        print(json.dumps(doc, indent=2))
        return 1

    model: list[str] = []
    if args.write_model:
        started = time.monotonic()
        path = work / f"random-{args.write_model}-Q4_K_M.gguf"
        wrote = subprocess.run([py, "bench/random_gguf.py", args.write_model, str(path)], cwd=REPO, env=env,
                               capture_output=True, text=True, timeout=600)
        doc["model"] = {"shape": args.write_model, "bytes": path.stat().st_size if path.exists() else 0,
                        "write_s": round(time.monotonic() - started, 1), **({"error": wrote.stderr[-2000:]}
                                                                          if wrote.returncode else {})}
        model = ["--model", str(path)]
    plan, err = run_json([py, "-m", "host_runtime.cli", "plan", *model, "--gpu-layers", "999", "--ctx-size", "1024",
                          "--parallel", "16", "--json"], env, 300)
    doc["plan"] = plan or {"error": err}

    # How the GPU's kernels compute a decode token beside others, per weight type (placement/matmul_rows.py covers
    # the CPU's alone). Lavapipe, 2026-12-07: Q4_K_M rows 4e-5 apart from 2 rows, 1.4-4.2 from 9.
    if args.row_probe_types:
        probe, err = run_json([py, "bench/row_probe.py", "--gpu-layers", "999", "--types", args.row_probe_types,
                               "--rows", str(args.row_probe_rows)], env, 900)
        doc["row_probe"] = probe or {"error": err}

    # NVML's readings, in discovery's raw form: a fixture for the translation tests.
    fixture, err = run_json([py, "-c", "import json; from host_runtime.gpu import nvml; raw, status = nvml.snapshot(); "
                             "print(json.dumps({'raw': raw, 'status': status}, default=str))"], env, 60)
    doc["nvml_fixture"] = fixture or {"error": err}

    # The governor, observe-only, beside the load: what it would do, never done.
    state = work / "governor.json"
    governor = subprocess.Popen([py, "-m", "host_runtime.cli", "governor", "run", "--backend", "auto", "--mode",
                                 "observe", "--state", str(state), "--tick", "1"], cwd=REPO, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
    started = time.monotonic()
    servers = args.servers + (",llama-server" if args.llama_server else "")
    bench_argv = [py, "bench/serving.py", "--servers", servers, *model, "--mode", "serving", "--gpu-layers", "999",
                  "--levels", args.levels, "--repeats", str(args.repeats), "--max-tokens", str(args.max_tokens),
                  "--parallel", str(max(int(x) for x in args.levels.split(","))), "--ctx-size", "1024",
                  "--requests-per-client", "1"]
    if args.llama_server:
        bench_argv += ["--llama-server", args.llama_server]
    serving, err = run_json(bench_argv, env, 3600)
    doc["serving"] = serving or {"error": err}
    samples = []
    while time.monotonic() - started < args.governor_seconds or not samples:
        try:
            samples.append(json.loads(state.read_text()))
        except (OSError, ValueError):
            pass
        time.sleep(1.0)
    governor.terminate()
    governor.wait(timeout=30)
    last = samples[-1] if samples else {}
    doc["governor"] = {"backend": last.get("backend"), "mode": last.get("mode"), "states_read": len(samples),
                       "gpus": last.get("gpus", []), "throttle_level": last.get("throttle_level"),
                       "exit_code": governor.returncode}
    doc["ok"] = bool(plan and plan.get("fits") and serving and doc["governor"]["mode"] == "observe")
    text = json.dumps(doc, indent=2, default=str)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "gpu_check.json").write_text(text)
        (Path(args.out) / "nvml_fixture.json").write_text(json.dumps(doc["nvml_fixture"], indent=2, default=str))
    print(text)
    return 0 if doc["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
