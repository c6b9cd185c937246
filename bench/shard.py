"""One model across boxes (#60): what a split costs, against the same model on one box and against llama.cpp's own
split (llama-server --rpc with ggml-rpc-server), the same split and the same machine.

Three network namespaces on one bridge (tests/fleet_hosts.py): a holder and two members. Each configuration runs on
fresh processes, its order reversed every other repeat:
- one_box: `everycycle serve` in the holder's namespace with the whole model;
- split: `everycycle fleet shard-host` in each member's namespace (llama.cpp's RPC server behind stunnel's TLS) and
  `everycycle serve --shard-host A --shard-host B --gpu-layers G --tensor-split 1,1` in the holder's;
- llama_server_rpc: `ggml-rpc-server` in each member's namespace (plain TCP, as llama.cpp ships it) and `llama-server
  --rpc A,B -ngl G -ts 1,1` in the holder's: the same layers on the same devices.
Every process gets --threads; the split's processes compute in turn (a layer runs where it lives), so each may
use every core. Measured from the root namespace, streaming chat at each --levels concurrency: generated tokens
per second and TTFT (p50, p95). Prints one JSON document (and writes it with --json PATH): each configuration's
figures (median and range over the repeats), the split's ratios over one_box and over llama_server_rpc repeat by
repeat with their spreads, the link the holder measured, each process's CPU per generated token (the holder's
server, workers, engine and tunnel; each member's) and the CPU's name and flags.

Needs root (namespaces) and the reference binaries (`make bench-ref`). Usage:
  sudo .venv/bin/python bench/shard.py [--repeats 3] [--levels 1,4] [--model GGUF] [--json F]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import secrets
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from host_runtime.engine.model import default_model_path  # noqa: E402
from tests.fleet_hosts import Net  # noqa: E402

from serving import (PARAGRAPH, Server, cpu_by_process, cpu_flags, cpu_name, cpu_per_token, median_cpu,  # noqa: E402
                     paired_ratio, run_level, spread)

CONFIGS = ("one_box", "split", "llama_server_rpc")
OURS_PORT, RPC_PORT, API_PORT = 50052, 50053, 8080
REF = Path(os.environ.get("HOME", "/root")) / ".cache/everycycle/bench-ref/llama-cpp-python-0.3.36/build/bin"


def wait_log(server: Server, needle: str, timeout: float = 60) -> None:
    """Until the server's log says `needle` (a member has no HTTP to ask)."""
    deadline = time.monotonic() + timeout
    while needle not in Path(server.log.name).read_text(errors="replace"):
        if server.proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"{server.name}: no {needle!r}; its log ends:\n{server.log_tail()}")
        time.sleep(0.2)


def cpu_of(procs: list[Server]) -> dict[str, float]:
    """CPU seconds so far of each process tree, by role, the holder's roles as they are, a member's prefixed."""
    used: dict[str, float] = {}
    for proc in procs:
        prefix = "" if proc is procs[-1] else f"{proc.name}."
        for role, seconds in cpu_by_process(proc.proc.pid).items():
            used[prefix + role] = used.get(prefix + role, 0.0) + seconds
    return used


def start(config: str, net: Net, args, key: Path, workdir: Path) -> list[Server]:
    """The configuration's processes, ready; the holder's last (run_level sends to it)."""
    py = [sys.executable, "-m", "host_runtime.cli"]
    members = [f"{net.address(i)}:{OURS_PORT if config == 'split' else RPC_PORT}" for i in (1, 2)]
    procs: list[Server] = []
    try:
        if config == "split":
            for i, member in zip((1, 2), members):
                procs.append(Server(f"member{i}", net.run_in(i, py + ["fleet", "shard-host", "--listen", member,
                                                                      "--key-file", str(key), "--threads",
                                                                      str(args.threads)]), 0, ""))
                wait_log(procs[-1], "lending")
        elif config == "llama_server_rpc":
            for i in (1, 2):
                procs.append(Server(f"rpc-server{i}", net.run_in(i, ["stdbuf", "-oL", str(args.rpc_server), "-H", net.address(i), "-p",
                                                                     str(RPC_PORT), "-t", str(args.threads)]), 0, ""))
                wait_log(procs[-1], "transport")
        host = net.address(0)
        common = ["--threads", str(args.threads), "--parallel", str(max(args.levels))]
        if config == "llama_server_rpc":
            argv = [str(args.llama_server), "-m", args.model, "--host", host, "--port", str(API_PORT), "-t",
                    str(args.threads), "-np", str(max(args.levels)), "-c", str(args.ctx * max(args.levels)),
                    "--rpc", ",".join(members), "-ngl", str(args.gpu_layers), "-ts", "1,1"]
            ready = "/health"
        else:
            argv = py + ["serve", "--host", host, "--port", str(API_PORT), "--model", args.model, "--ctx-size",
                         str(args.ctx), "--run-dir", str(workdir / f"run-{config}"), *common, *args.serve_args.split()]
            if config == "split":
                argv += ["--shard-key-file", str(key), "--gpu-layers", str(args.gpu_layers), "--tensor-split", "1,1"]
                for member in members:
                    argv += ["--shard-host", member]
            ready = "/ready"
        procs.append(Server(config, net.run_in(0, argv), API_PORT, ready, host=host))
        procs[-1].wait_ready(300)
        return procs
    except BaseException:
        for proc in reversed(procs):
            proc.stop()
        raise


def body_for(args):
    def body(ci: int, ri: int) -> dict:
        return {"model": Path(args.model).stem, "stream": True, "stream_options": {"include_usage": True},
                "temperature": 0, "max_tokens": args.max_tokens,
                "messages": [{"role": "user", "content": f"({ci}.{ri}) {PARAGRAPH}"}]}
    return body


def measure(config: str, net: Net, args, key: Path, workdir: Path) -> dict:
    procs = start(config, net, args, key, workdir)
    try:
        holder = procs[-1]
        run_level(holder, 1, 1, body_for(args))  # warm: the first request's one-time costs
        levels, cpu = {}, {}
        for c in args.levels:
            # every process of the configuration (members by name), so a cost on the shared cores shows where
            before = cpu_of(procs)
            levels[str(c)] = run_level(holder, c, args.requests_per_client, body_for(args))
            cpu[str(c)] = cpu_per_token(before, cpu_of(procs), levels[str(c)].get("tokens", 0), None, args.threads)
        log = Path(holder.log.name).read_text(errors="replace")
        link = re.findall(r"\(RPC protocol [^;]+; ([^)]+)\)", log) if config == "split" else []
        return {"levels": levels, "cpu": cpu, **({"links": link} if link else {})}
    finally:
        for proc in reversed(procs):
            proc.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(default_model_path()), help="GGUF (default: the built-in SmolLM2-135M)")
    ap.add_argument("--gpu-layers", type=int, default=20, help="layers on the members, half each (default 20 of "
                                                                 "SmolLM2's 30 and its head)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--levels", default="1,4", type=lambda s: [int(x) for x in s.split(",")])
    ap.add_argument("--requests-per-client", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--ctx", type=int, default=1024, help="context per sequence")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--configs", default=",".join(CONFIGS), type=lambda s: s.split(","))
    ap.add_argument("--serve-args", default="", help="more options for EveryCycle's serve (one_box and split), "
                                                     "e.g. --mixed-batches")
    ap.add_argument("--llama-server", type=Path, default=REF / "llama-server")
    ap.add_argument("--rpc-server", type=Path, default=REF / "ggml-rpc-server")
    ap.add_argument("--json", type=Path, help="also write the JSON here")
    args = ap.parse_args()
    if "llama_server_rpc" in args.configs and not (args.llama_server.exists() and args.rpc_server.exists()):
        raise SystemExit(f"no {args.llama_server} or {args.rpc_server}: `make bench-ref` builds them")
    workdir = Path(tempfile.mkdtemp(prefix="bench-shard-"))
    key = workdir / "fleet.key"
    key.write_text(secrets.token_urlsafe(32) + "\n")
    key.chmod(0o600)
    net = Net(3)
    runs: dict[str, list[dict]] = {c: [] for c in args.configs}
    try:
        for repeat in range(args.repeats):
            order = args.configs if repeat % 2 == 0 else list(reversed(args.configs))
            for config in order:
                result = measure(config, net, args, key, workdir)
                runs[config].append(result)
                print(f"repeat {repeat + 1} {config}: " + ", ".join(
                    f"c={c} {r['tok_s']:.1f} tok/s TTFT {r['ttft_p50_s'] or 0:.3f} s"
                    for c, r in result["levels"].items()), file=sys.stderr, flush=True)
    finally:
        net.remove()
    levels = [str(c) for c in args.levels]
    figures = {config: {c: {key_: spread([r["levels"][c].get(key_) for r in results])
                            for key_ in ("tok_s", "ttft_p50_s", "ttft_p95_s", "itl_p50_s")} |
                        {"errors": sum(r["levels"][c]["errors"] for r in results)}
                        for c in levels} for config, results in runs.items()}
    ratios = {}
    for reference in ("one_box", "llama_server_rpc"):
        if "split" in runs and reference in runs:
            ratios[f"split_vs_{reference}"] = {
                c: {key_: paired_ratio([r["levels"][c] for r in runs["split"]],
                                       [r["levels"][c] for r in runs[reference]], key_)
                    for key_ in ("tok_s", "ttft_p50_s")} for c in levels}
    doc = {"bench": "shard", "date": time.strftime("%Y-%m-%d"), "model": Path(args.model).name,
           "gpu_layers_on_members": args.gpu_layers, "threads": args.threads, "levels": args.levels,
           "serve_args": args.serve_args,
           "requests_per_client": args.requests_per_client, "max_tokens": args.max_tokens, "repeats": args.repeats,
           "cpu": {"name": cpu_name(), "count": os.cpu_count(), "flags": cpu_flags(), "machine": platform.machine()},
           "configs": figures, "ratios": ratios,
           # CPU per generated token by process, median over the repeats (the holder's: server, workers, engine)
           "cpu_per_token": {config: {c: median_cpu([r["cpu"][c] for r in results]) for c in levels}
                             for config, results in runs.items()},
           "links": [link for r in runs.get("split", []) for link in r.get("links", [])],
           "runs": runs}
    text = json.dumps(doc, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
