#!/usr/bin/env python3
"""Serving benchmark: EveryCycle against llama-server (C++) and llama-cpp-python's server.

Same model, same prompts, same thread count; the servers take turns (A, B, C, then
C, B, A, ...) so that drift on a shared machine cancels; every request opens a fresh
connection (llama-server closes keep-alive after a streamed answer, so all get the same).
Prints one JSON document: per level and server the aggregate output tok/s, TTFT p50/p95,
inter-token latency p50 and errors (medians over repeats), the ratios EveryCycle/other, each main ratio's
spread over the repeats (median, min, max of the repeat-by-repeat ratios: a 0.77x told from noise), the CPU's
instruction sets and whether each server repacked the weights for them, each server's CPU per generated token
by process (EveryCycle's also outside its decode calls), and the prefix cache's miss / RAM-hit / disk-hit TTFT.

    python bench/serving.py --llama-server PATH [--levels 1,4,8,16] [--repeats 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STREAM_TIMEOUT_S = 3600  # the agent workload's first turns on 2 cores: four 12,000-token prompts at once
API_KEY = "bench"  # servers started here run without keys; --api-key for one that has them
sys.path.insert(0, str(REPO))

from host_runtime.common.processes import stop_process  # noqa: E402  (after the path above)

PARAGRAPH = ("Our cooperative repairs old bicycles donated by the neighbourhood, teaches volunteers how to true "
             "wheels and adjust brakes, and lends the finished bikes to students for a whole term. Please write "
             "a short, friendly announcement for the community newsletter that explains how to donate a bicycle, "
             "when the workshop is open, and why repaired bikes matter for the city.")


# The code-edit workload: a file in the prompt and a request for the whole edited file back. The answer repeats
# most of the prompt, which is what prompt-lookup speculation drafts from (issue 18's workload).
CODE_FILE = '''import json
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Bicycle:
    owner: str
    frame_size: int
    repaired: bool = False

    def label(self) -> str:
        state = "ready" if self.repaired else "in the workshop"
        return f"{self.owner}'s bicycle ({self.frame_size} cm), {state}"


def load_bicycles(path: Path) -> list[Bicycle]:
    with open(path) as f:
        rows = json.load(f)
    return [Bicycle(row["owner"], row["frame_size"], row.get("repaired", False)) for row in rows]


def save_bicycles(path: Path, bicycles: list[Bicycle]) -> None:
    rows = [{"owner": b.owner, "frame_size": b.frame_size, "repaired": b.repaired} for b in bicycles]
    with open(path, "w") as f:
        json.dump(rows, f, indent=2)


def ready_for_loan(bicycles: list[Bicycle]) -> list[Bicycle]:
    return [b for b in bicycles if b.repaired]
'''
# llama-server's prompt-lookup speculation (no draft model), as its docs show it for rewriting code: the last
# 12 tokens looked up in the history, up to 48 drafted (its defaults for ngram-simple).
LLAMA_SERVER_NGRAM = ["--spec-type", "ngram-simple"]
CODE_EDIT = ("Here is a Python file:\n\n```python\n{file}```\n\nRename the class Bicycle to Bike everywhere in "
             "this file. Reply with the whole edited file only, in one code block.")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def end_of_generation_ids(model_path: str) -> list[int]:
    """The model's end tokens, from its vocabulary alone (no weights loaded)."""
    import llama_cpp
    from llama_cpp._internals import LlamaModel

    from host_runtime.engine.model import end_of_generation_tokens

    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = LlamaModel(path_model=model_path, params=params, verbose=False)
    return sorted(end_of_generation_tokens(model.vocab, model.n_vocab()))


class Server:
    def __init__(self, name: str, argv: list[str], port: int, ready_path: str, env: dict | None = None,
                 cwd: Path = REPO, host: str = "127.0.0.1"):
        self.name, self.argv, self.port, self.ready_path, self.host = name, argv, port, ready_path, host
        self.log = tempfile.NamedTemporaryFile(prefix=f"bench-{name}-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
                                     cwd=cwd, env=env)

    def wait_ready(self, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"{self.name} exited; log: {self.log.name}; its end:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"http://{self.host}:{self.port}{self.ready_path}", timeout=5) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.3)
        raise SystemExit(f"{self.name} not ready after {timeout}s; log: {self.log.name}")

    def log_tail(self, lines: int = 30) -> str:
        """The log's last lines without the readiness polls: the reason a server died, where the log itself
        stays behind (a lent machine)."""
        text = Path(self.log.name).read_text(errors="replace").splitlines()
        return "\n".join([line for line in text if f"GET {self.ready_path}" not in line][-lines:])

    def metrics(self) -> dict[str, float]:
        from host_runtime.common.prometheus_text import parse_prometheus

        with urllib.request.urlopen(f"http://{self.host}:{self.port}/metrics", timeout=10) as r:
            return parse_prometheus(r.read().decode())

    def stop(self) -> None:
        stop_process(self.proc, 20, group=True)


def stream_chat(port: int, body: dict, host: str = "127.0.0.1") -> dict:
    """One streamed chat request on a fresh connection: times of send, first token and each token."""
    started = time.perf_counter()
    conn = http.client.HTTPConnection(host, port, timeout=STREAM_TIMEOUT_S)
    token_times: list[float] = []
    text: list[str] = []
    usage: dict = {}
    try:
        conn.request("POST", "/v1/chat/completions", body=json.dumps(body),
                     headers={"Content-Type": "application/json", "Authorization": f"Bearer {API_KEY}"})
        resp = conn.getresponse()
        if resp.status != 200:
            return {"error": f"HTTP {resp.status}: {resp.read()[:200]!r}"}
        while True:
            line = resp.fp.readline()
            if not line:
                break
            if not line.startswith(b"data: "):
                continue
            data = line[6:].strip()
            if data == b"[DONE]":
                break
            chunk = json.loads(data)
            if "error" in chunk:
                return {"error": str(chunk["error"])[:200]}
            usage = chunk.get("usage") or usage  # the last chunk's, where the body asked (stream_options)
            for choice in chunk.get("choices", []):
                if (choice.get("delta") or {}).get("content"):
                    token_times.append(time.perf_counter())
                    text.append(choice["delta"]["content"])
    except (OSError, http.client.HTTPException, ValueError) as exc:
        return {"error": repr(exc)}
    finally:
        conn.close()
    if not token_times:
        return {"error": "no tokens"}
    return {"start": started, "end": token_times[-1], "ttft": token_times[0] - started,
            "gaps": [b - a for a, b in zip(token_times, token_times[1:])], "tokens": len(token_times),
            "text": "".join(text), **_prompt_usage(usage)}


def _prompt_usage(usage: dict) -> dict:
    """Prompt tokens and the part of them the server took from its cache, where it reported them."""
    if not usage.get("prompt_tokens"):
        return {}
    return {"prompt_tokens": usage["prompt_tokens"],
            "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens")}


def run_level(server: Server, concurrency: int, per_client: int, body_for) -> dict:
    results: list[dict] = []
    lock = threading.Lock()

    def client(ci: int) -> None:
        for ri in range(per_client):
            r = stream_chat(server.port, body_for(ci, ri), server.host)
            with lock:
                results.append(r)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ok = [r for r in results if "error" not in r]
    errors = [r["error"] for r in results if "error" in r]
    if not ok:
        return {"tok_s": 0.0, "ttft_p50_s": None, "ttft_p95_s": None, "itl_p50_s": None, "errors": len(errors),
                "error_sample": errors[:2]}
    wall = max(r["end"] for r in ok) - min(r["start"] for r in ok)
    tokens = sum(r["tokens"] for r in ok)
    return {"tok_s": tokens / wall if wall > 0 else 0.0,
            "ttft_p50_s": percentile([r["ttft"] for r in ok], 0.5),
            "ttft_p95_s": percentile([r["ttft"] for r in ok], 0.95),
            "itl_p50_s": percentile([g for r in ok for g in r["gaps"]], 0.5),
            "tokens_per_request": tokens / len(ok), "tokens": tokens, "requests": len(results), "errors": len(errors),
            **({"error_sample": errors[:2]} if errors else {})}


def cpu_by_process(root_pid: int) -> dict[str, float]:
    """CPU seconds (user + system) each process of a server's tree has used so far, by role: the server's own
    process ("server": gunicorn's master for everycycle, the whole of llama-server), its HTTP workers (forks of it:
    the same command line, or gunicorn's title for them), its engines (the `engine` subcommand) and any other by its name."""
    import psutil

    root = psutil.Process(root_pid)
    used: dict[str, float] = {}
    for proc in [root, *root.children(recursive=True)]:
        try:
            times, argv = proc.cpu_times(), proc.cmdline()
        except psutil.Error:
            continue  # gone meanwhile
        role = ("server" if proc.pid == root_pid else "engine" if "engine" in argv[1:] or "host_runtime.engine" in
                " ".join(argv) else "workers" if argv == root.cmdline() or argv[:1] and argv[0].startswith(
                    "gunicorn: worker") else proc.name())
        used[role] = used.get(role, 0.0) + times.user + times.system
    return used


def cpu_per_token(before: dict[str, float], after: dict[str, float], tokens: int, decode_s: float | None,
                  threads: int) -> dict:
    """CPU milliseconds per generated token by role over one run, and, where the server says how long its decode
    calls took (everycycle's counters), the part outside them: every llama.cpp thread is busy through a call
    (ggml's threads wait for each other spinning), so a call costs about its time times the threads."""
    if not tokens:
        return {}
    per = {role: 1000 * (after[role] - before.get(role, 0.0)) / tokens for role in after}
    out = {"cpu_ms_per_token": per, "total_cpu_ms_per_token": sum(per.values())}
    if decode_s is not None:
        inside = 1000 * decode_s * threads / tokens
        out["decode_cpu_ms_per_token"] = inside
        out["outside_decode_cpu_ms_per_token"] = out["total_cpu_ms_per_token"] - inside
    return out


def spread(values: list[float]) -> dict | None:
    """A figure over repeats: its median and its range, so that a ratio can be told from the machine's noise."""
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"median": round(statistics.median(values), 4), "min": round(min(values), 4),
            "max": round(max(values), 4), "n": len(values)}


def paired_ratio(runs: list[dict], reference: list[dict], key: str) -> dict | None:
    """The ratio of `key` repeat by repeat (each repeat runs both servers back to back, in alternating order), as
    a spread: pairing keeps a slow minute of the machine from counting against one server only."""
    ratios = [a[key] / b[key] for a, b in zip(runs, reference) if a.get(key) and b.get(key)]
    return spread(ratios)


# The pairs whose ratios get a spread: (server, reference).
SPREAD_PAIRS = (("everycycle", "llama-server"), ("everycycle", "everycycle-baseline"),
                ("everycycle", "everycycle-mixed"), ("everycycle-mixed", "llama-server"))


def ratio_spreads(raw_level: dict[str, list[dict]]) -> dict:
    out = {}
    for name, ref in SPREAD_PAIRS:
        if raw_level.get(name) and raw_level.get(ref):
            for key, label in (("tok_s", "tok_s"), ("ttft_p50_s", "ttft_p50")):
                figure = paired_ratio(raw_level[name], raw_level[ref], key)
                if figure:
                    out[f"{name}_{label}_vs_{ref}".replace("-", "_")] = figure
    return out


CPU_FLAGS = ("avx", "avx2", "fma", "f16c", "avx_vnni", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
             "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16", "asimd", "asimddp", "i8mm", "sve", "sve2")


def cpu_flags(cpuinfo: str | None = None) -> list[str]:
    """The instruction sets llama.cpp's CPU kernels choose by (x86's flags, ARM's Features), as /proc/cpuinfo
    lists them."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return []
    from host_runtime.discovery.cpu import cpuinfo_flags

    have = cpuinfo_flags(cpuinfo)
    return [f for f in CPU_FLAGS if f in have]


def repacked(log_text: str) -> bool | None:
    """Whether llama.cpp repacked the weights for this CPU: llama-server's log names the CPU_REPACK buffer it
    allocates; EveryCycle's engine says it in words (engine/model.py). None where the log does not say: a newer
    llama-server at its default verbosity prints no buffer lines (recorded as unknown, not as no)."""
    if "CPU_REPACK model buffer" in log_text or "weights repacked for this CPU" in log_text:
        return True
    if "model buffer size" in log_text or "weights not repacked for this CPU" in log_text:
        return False
    return None


def median_of(runs: list[dict]) -> dict:
    out = {}
    for key in ("tok_s", "ttft_p50_s", "ttft_p95_s", "itl_p50_s", "tokens_per_request"):
        values = [r[key] for r in runs if r.get(key) is not None]
        out[key] = statistics.median(values) if values else None
    out["errors"] = sum(r["errors"] for r in runs)
    out["runs"] = [round(r["tok_s"], 2) for r in runs]
    return out


def start_servers(args, model: str, model_id: str, workdir: Path) -> list[Server]:
    servers = []
    # Each server's spelling of "offload N layers" (nothing when --gpu-layers is not given).
    n = args.gpu_layers
    gpu = {"everycycle": ["--gpu-layers", str(n)] if n is not None else [],
           "llama-server": ["-ngl", str(n)] if n is not None else [],
           "llama-cpp-python": ["--n_gpu_layers", str(n)] if n is not None else []}
    py = sys.executable
    wanted = args.servers.split(",")
    # everycycle's two batching modes: the default (batch-invariant: a request's temperature-0 output the same
    # alone or batched) and --mixed-batches (prompt chunks and decode tokens in one call, as llama-server).
    # everycycle-spec: the default with prompt-lookup speculative decoding (serve --speculation ngram), drafting as
    # far as the measured cost of calls says pays; everycycle-spec-always: drafting whatever it costs;
    # everycycle-draft: with a draft model (--draft-model, by default the target itself: the mechanism's cost).
    draft = args.draft_model or model
    # everycycle-baseline: the default mode, from another checkout of this repository (an earlier commit: `git
    # worktree add DIR REV`), with this venv: the change's cost measured in the same run, turn about.
    base = Path(args.baseline_checkout).resolve() if args.baseline_checkout else None
    if base is not None:
        wanted = [*wanted, "everycycle-baseline"]
    for name, mode in (("everycycle-baseline", []), ("everycycle", []), ("everycycle-mixed", ["--mixed-batches"]),
                       ("everycycle-spec", ["--speculation", "ngram", "--draft-max", str(args.draft_max)]),
                       ("everycycle-spec-always", ["--speculation", "ngram", "--draft-max", str(args.draft_max),
                                                   "--draft-always"]),
                       ("everycycle-draft", ["--speculation", "draft", "--draft-model", draft,
                                             "--draft-max", str(args.draft_max)])):
        if name not in wanted:
            continue
        port = free_port()
        servers.append(Server(name, [py, "-m", "host_runtime.cli", "serve", "--port", str(port),
                                     *getattr(args, "everycycle_extra", []),
                                     "--model", model, "--threads", str(args.threads),
                                     *(["--decode-threads", str(args.decode_threads)] if args.decode_threads else []),
                                     "--parallel", str(args.parallel), "--ctx-size", str(args.ctx_size),
                                     "--run-dir", str(workdir / name), *mode, *gpu["everycycle"]], port,
                              "/ready", **({"env": {**os.environ, "PYTHONPATH": str(base)}, "cwd": base}
                                           if name == "everycycle-baseline" else {})))
    # llama-server-spec: llama-server with its own prompt-lookup speculation (no draft model);
    # llama-server-draft: with the same draft model as everycycle-draft, its draft-simple type (--model-draft
    # alone loads the draft and drafts nothing). Where the CPU has AMX, every llama-server runs without
    # repacked weights, as everycycle does there (placement/llama_params.extra_buffers_safe): this llama.cpp's
    # AMX matrix multiply segfaults in a batched decode (seen here in llama-server, plain and with a draft).
    from host_runtime.placement.llama_params import extra_buffers_safe

    no_repack = [] if extra_buffers_safe() else ["--no-repack"]
    for name, mode in (("llama-server", []), ("llama-server-spec", LLAMA_SERVER_NGRAM),
                       ("llama-server-draft", ["--model-draft", draft, "--spec-type", "draft-simple"])):
        if name not in wanted:
            continue
        port = free_port()
        servers.append(Server(name, [args.llama_server, "-m", model, "--host", "127.0.0.1", "--port",
                                     str(port), "-t", str(args.threads), "-tb", str(args.threads),
                                     "-np", str(args.parallel), "-c", str(args.ctx_size * args.parallel),
                                     "--alias", model_id, "--no-webui", *mode, *no_repack, *gpu["llama-server"],
                                     *getattr(args, "llama_server_extra", [])], port,
                              "/health"))
    if "llama-cpp-python" in wanted:
        port = free_port()
        servers.append(Server("llama-cpp-python", [py, "-m", "llama_cpp.server", "--model", model, "--host",
                                                   "127.0.0.1", "--port", str(port), "--n_threads", str(args.threads),
                                                   "--n_threads_batch", str(args.threads), "--n_ctx",
                                                   str(args.ctx_size), "--interrupt_requests", "False",
                                                   "--model_alias", model_id, *gpu["llama-cpp-python"]], port,
                                  "/v1/models"))
    all_ready(servers)
    return servers


def all_ready(servers) -> None:
    """Wait for every server; if one never gets ready, stop them all before failing (seen: a crashed
    llama-server left every other server of that run serving, idle, through the later runs)."""
    try:
        for s in servers:
            s.wait_ready()
    except BaseException:
        for s in servers:
            s.stop()
        raise


def serving_mode(args, model: str, model_id: str, bias: dict, workdir: Path) -> dict:
    servers = start_servers(args, model, model_id, workdir)
    levels = [int(x) for x in args.levels.split(",")]

    def body_for(ci: int, ri: int) -> dict:
        # A unique start per request: no server can serve a whole prompt from a cache.
        tag = uuid.uuid4().hex[:12]
        if args.workload == "code-edit":
            content = CODE_EDIT.format(file=f"# inventory {tag}\n{CODE_FILE}")
        else:
            content = f"[{tag}] {PARAGRAPH}"
        return {"model": model_id, "stream": True, "temperature": 0, "max_tokens": args.max_tokens,
                "logit_bias": bias, "messages": [{"role": "user", "content": content}]}

    try:
        for s in servers:  # warm-up: first requests pay for page faults and thread start-up
            run_level(s, 2, 1, body_for)
        raw: dict[int, dict[str, list]] = {lvl: {s.name: [] for s in servers} for lvl in levels}
        profile: dict[int, dict[str, list]] = {lvl: {} for lvl in levels}  # everycycle's own steps, per server
        cpu: dict[int, dict[str, list]] = {lvl: {} for lvl in levels}  # each server's CPU per token, by process
        for rep in range(args.repeats):
            order = servers if rep % 2 == 0 else list(reversed(servers))
            for lvl in levels:
                for s in order:
                    before = s.metrics() if s.name.startswith("everycycle") else None
                    cpu_before = cpu_by_process(s.proc.pid)
                    t0 = time.perf_counter()
                    result = run_level(s, lvl, args.requests_per_client, body_for)
                    wall = time.perf_counter() - t0
                    cpu_after = cpu_by_process(s.proc.pid)
                    raw[lvl][s.name].append(result)
                    decode_s = None
                    if before is not None:
                        after = s.metrics()
                        profile[lvl].setdefault(s.name, []).append(step_profile(before, after, wall))
                        decode_s = sum(after.get(f"everycycle_{k}", 0) - before.get(f"everycycle_{k}", 0)
                                       for k in ("prompt_seconds_total", "predicted_seconds_total"))
                    cpu[lvl].setdefault(s.name, []).append(cpu_per_token(cpu_before, cpu_after,
                                                                         result.get("tokens", 0), decode_s,
                                                                         args.threads))
                    print(f"  rep {rep + 1} c={lvl:<2} {s.name:<17} {result['tok_s']:7.1f} tok/s  "
                          f"ttft p50 {fmt(result['ttft_p50_s'])}  errors {result['errors']}", file=sys.stderr)
        table = {str(lvl): {name: median_of(runs) for name, runs in by.items()} for lvl, by in raw.items()}
        ratios = {}
        for lvl, by in table.items():
            ec = by.get("everycycle")
            if not ec:
                continue
            r = {}
            base = by.get("everycycle-baseline")
            if base and base["tok_s"]:  # this checkout against --baseline-checkout's, same run, turn about
                r["tok_s_vs_baseline"] = ec["tok_s"] / base["tok_s"]
                if ec["ttft_p50_s"] and base["ttft_p50_s"]:
                    r["ttft_p50_vs_baseline"] = ec["ttft_p50_s"] / base["ttft_p50_s"]
            mixed = by.get("everycycle-mixed")
            if mixed and mixed["tok_s"]:
                # what the invariance guarantee costs: below 1, the invariant default is the faster mode
                r["tok_s_vs_mixed"] = ec["tok_s"] / mixed["tok_s"]
                if ec["ttft_p50_s"] and mixed["ttft_p50_s"]:
                    r["ttft_p50_vs_mixed"] = ec["ttft_p50_s"] / mixed["ttft_p50_s"]
                if "llama-server" in by and by["llama-server"]["tok_s"]:
                    r["mixed_tok_s_vs_llama_server"] = mixed["tok_s"] / by["llama-server"]["tok_s"]
            if "llama-server" in by and by["llama-server"]["tok_s"]:
                r["tok_s_vs_llama_server"] = ec["tok_s"] / by["llama-server"]["tok_s"]
                if ec["ttft_p50_s"] and by["llama-server"]["ttft_p50_s"]:
                    r["ttft_p50_vs_llama_server"] = ec["ttft_p50_s"] / by["llama-server"]["ttft_p50_s"]
            spec, spec_ref = by.get("everycycle-spec"), by.get("llama-server-spec")
            if spec and spec["tok_s"]:
                # everycycle with speculation against the default without it, and against llama-server's own
                r["tok_s_vs_no_speculation"] = spec["tok_s"] / ec["tok_s"]
                if spec_ref and spec_ref["tok_s"]:
                    r["tok_s_vs_llama_server_speculative"] = spec["tok_s"] / spec_ref["tok_s"]
                always = by.get("everycycle-spec-always")
                if always and always["tok_s"]:
                    r["spec_cost_aware_vs_draft_always"] = spec["tok_s"] / always["tok_s"]
            drafted, drafted_ref = by.get("everycycle-draft"), by.get("llama-server-draft")
            if drafted and drafted["tok_s"]:
                # the same with a draft model, against no speculation and against llama-server with that draft
                r["draft_tok_s_vs_no_speculation"] = drafted["tok_s"] / ec["tok_s"]
                if drafted_ref and drafted_ref["tok_s"]:
                    r["draft_tok_s_vs_llama_server_draft"] = drafted["tok_s"] / drafted_ref["tok_s"]
            if spec_ref and spec_ref["tok_s"] and "llama-server" in by and by["llama-server"]["tok_s"]:
                r["llama_server_spec_vs_plain"] = spec_ref["tok_s"] / by["llama-server"]["tok_s"]
            if "llama-cpp-python" in by and by["llama-cpp-python"]["tok_s"]:
                r["tok_s_vs_llama_cpp_python"] = ec["tok_s"] / by["llama-cpp-python"]["tok_s"]
            ratios[lvl] = r
        everycycle_profile = {str(lvl): {name: {k: statistics.median(p[k] for p in runs) for k in runs[0]}
                                         for name, runs in by_name.items()}
                              for lvl, by_name in profile.items() if by_name}
        spreads = {str(lvl): ratio_spreads(by) for lvl, by in raw.items()}
        repack = {}
        for s in servers:
            try:
                repack[s.name] = repacked(Path(s.log.name).read_text(errors="replace"))
            except OSError:
                pass
        return {"workload": args.workload, "levels": table, "ratios": ratios, "ratio_spreads": spreads,
                "weights_repacked": repack, "everycycle_profile": everycycle_profile,
                "cpu_per_token": {str(lvl): {name: median_cpu(runs) for name, runs in by.items()}
                                  for lvl, by in cpu.items()}}
    finally:
        for s in servers:
            s.stop()


def median_cpu(runs: list[dict]) -> dict:
    """cpu_per_token's figures, each the median over the repeats."""
    runs = [r for r in runs if r]
    if not runs:
        return {}
    out: dict = {"cpu_ms_per_token": {role: statistics.median(r["cpu_ms_per_token"].get(role, 0.0) for r in runs)
                                      for role in runs[0]["cpu_ms_per_token"]}}
    for key in runs[0]:
        if key != "cpu_ms_per_token":
            out[key] = statistics.median(r[key] for r in runs)
    return out


def agent_model(workdir: Path) -> str:
    """A random-weight model of the default model's own architecture and quantization (SmolLM2-135M: 30 layers,
    576 wide, grouped KV heads, Q4_1) trained, by its metadata, for 32,768 tokens: its text is nonsense, its work
    per token the default model's."""
    from tests.tiny_gguf import write_long_context_llama

    path = workdir / "random-smollm2-135m-32k-q4_1.gguf"
    return str(write_long_context_llama(path, n_ctx=32768, n_embd=576, n_layer=30, n_head=9, n_head_kv=3,
                                        n_ff=1536, matrix_type="q4_1"))


def agent_mode(args, model: str, model_id: str, bias: dict, workdir: Path) -> dict:
    """Coding-agent sessions sharing one long system prompt (bench/agent_workload.py), each server in turn, with
    the same context, KV type and flash attention: EveryCycle's invariant default runs without flash attention
    at f16 and with it at a quantized type, so llama-server gets -fa off / on to match."""
    import llama_cpp
    from llama_cpp._internals import LlamaModel

    from host_runtime.placement.model_table import read_table

    from bench.agent_workload import (everycycle_kv_bytes_per_token, llama_server_kv_bytes_per_token, run_sessions,
                                      system_prompt)

    kv = args.cache_type
    args.everycycle_extra = ["--cache-type-k", kv, "--cache-type-v", kv]
    args.llama_server_extra = ["-fa", "off" if kv == "f16" else "on", "-ctk", kv, "-ctv", kv]
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    vocab = LlamaModel(path_model=model, params=params, verbose=False)

    def count_tokens(text: str) -> int:
        return len(vocab.tokenize(text.encode(), add_bos=False, special=False))

    servers = start_servers(args, model, model_id, workdir)
    try:
        for s in servers:  # warm-up: page faults and thread start-up, on a short prompt
            run_level(s, 1, 1, lambda ci, ri: {"model": model_id, "stream": True, "max_tokens": 8,
                                                "messages": [{"role": "user", "content": "hello"}]})
        raw: dict[str, list[dict]] = {s.name: [] for s in servers}
        system_tokens = None
        for rep in range(args.repeats):
            system = system_prompt(count_tokens, args.system_tokens, f"repeat {rep} {uuid.uuid4().hex[:8]}")
            system_tokens = count_tokens(system)
            for s in (servers if rep % 2 == 0 else list(reversed(servers))):
                result = run_sessions(stream_chat, percentile, s.port, model_id, system, sessions=args.sessions,
                                      turns=args.turns, max_tokens=args.max_tokens, bias=bias,
                                      tag=f"{rep}-{s.name}", user_words=args.turn_words,
                                      turn_interval_s=args.turn_interval)
                raw[s.name].append(result)
                print(f"  rep {rep + 1} agent {s.name:<17} {result['tok_s']:7.1f} tok/s  ttft p50 "
                      f"{fmt(result['ttft_p50_s'])}  first turns {fmt(result['ttft_first_turn_p50_s'])}  later "
                      f"{fmt(result['ttft_later_turns_p50_s'])}  {result['wall_s']} s  errors {result['errors']}",
                      file=sys.stderr)
        table = {}
        for name, runs in raw.items():
            table[name] = {k: statistics.median(r[k] for r in runs) if all(r.get(k) is not None for r in runs)
                           else None for k in ("tok_s", "ttft_p50_s", "ttft_p95_s", "ttft_first_turn_p50_s",
                                               "ttft_later_turns_p50_s", "itl_p50_s", "wall_s")}
            table[name]["errors"] = sum(r["errors"] for r in runs)
            if args.turn_interval > 0:
                table[name]["late_turns"] = sum(r.get("late_turns", 0) for r in runs)
        kv_per_token = {}
        for s in servers:
            if s.name.startswith("everycycle"):
                kv_per_token[s.name] = everycycle_kv_bytes_per_token(s.metrics(), args.ctx_size * args.parallel)
            else:  # its log states the size where its verbosity does; else llama.cpp's layout for its -ctk/-ctv
                kv_per_token[s.name] = (llama_server_kv_bytes_per_token(Path(s.log.name).read_text(errors="replace"))
                                        or read_table(model).kv_bytes_per_token((kv, kv)))
        ratios = {}
        ec, ref = table.get("everycycle"), table.get("llama-server")
        if ec and ref:
            ratios["tok_s_vs_llama_server"] = ec["tok_s"] / ref["tok_s"] if ref["tok_s"] else None
            for key in ("ttft_p50", "ttft_first_turn_p50", "ttft_later_turns_p50"):
                a, b = ec[f"{key}_s"], ref[f"{key}_s"]
                ratios[f"{key}_vs_llama_server"] = a / b if a and b else None
            ratios["kv_bytes_per_token"] = {name: kv_per_token.get(name) for name in ("everycycle", "llama-server")}
        base = table.get("everycycle-baseline")
        if ec and base:  # this checkout against --baseline-checkout's, same run, turn about
            ratios["tok_s_vs_baseline"] = ec["tok_s"] / base["tok_s"] if base["tok_s"] else None
            for key in ("ttft_p50", "ttft_first_turn_p50", "ttft_later_turns_p50"):
                a, b = ec[f"{key}_s"], base[f"{key}_s"]
                ratios[f"{key}_vs_baseline"] = a / b if a and b else None
        spreads = {}
        if raw.get("everycycle") and raw.get("llama-server"):
            for key, label in (("tok_s", "tok_s"), ("ttft_p50_s", "ttft_p50")):
                spreads[f"everycycle_{label}_vs_llama_server"] = paired_ratio(raw["everycycle"], raw["llama-server"], key)
        return {"workload": "agent",
                "agent": {"sessions": args.sessions, "turns": args.turns, "system_prompt_tokens": system_tokens,
                          "turn_words": args.turn_words, "turn_interval_s": args.turn_interval,
                          "answer_tokens": args.max_tokens,
                          "cache_type": kv, "flash_attention": kv != "f16", "servers": table,
                          "kv_bytes_per_token": kv_per_token, "runs": raw_summary(raw)},
                "ratios": {"agent": ratios}, "ratio_spreads": {"agent": spreads}}
    finally:
        for s in servers:
            s.stop()


class ParkedPeak:
    """The most bytes parked per tier while a run goes (the gauge is back to 0 once every parked request resumed),
    read from /metrics twice a second."""

    def __init__(self, server: Server):
        self.server, self.peak, self._stop = server, {}, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            try:
                m = self.server.metrics()
            except OSError:
                continue
            for key, value in m.items():
                if key.startswith("everycycle_parked_bytes{"):
                    tier = key.split('tier="', 1)[1].split('"', 1)[0] if 'tier="' in key else key
                    self.peak[tier] = max(self.peak.get(tier, 0), value)

    def stop(self) -> dict:
        self._stop.set()
        self._thread.join(5)
        return self.peak


def team_mode(args, model: str, model_id: str, bias: dict, workdir: Path) -> dict:
    """A team's box (bench/team_workload.py): a batch flood while people chat, with EveryCycle's priority classes
    on and off (the same server, the batch's `priority` field given or not) and against llama-server; the
    people's idle TTFT as the floor."""
    from bench.team_workload import run_team

    # Room in the queue for the whole flood and the people (by default 4 a sequence: a 64-request job on 8
    # sequences would be refused in part, 503 queue_full); llama-server queues without bound.
    args.everycycle_extra = [*getattr(args, "everycycle_extra", []), "--max-queue",
                             str(max(4 * args.parallel, args.team_batch + args.sessions))]
    servers = start_servers(args, model, model_id, workdir)
    try:
        for s in servers:  # warm-up: page faults and thread start-up
            run_level(s, 1, 1, lambda ci, ri: {"model": model_id, "stream": True, "max_tokens": 8,
                                                "messages": [{"role": "user", "content": "hello"}]})
        runs = [(s, classes) for s in servers for classes in ((True, False) if s.name == "everycycle" else (False,))]
        raw: dict[str, list[dict]] = {}
        floor: dict[str, list[dict]] = {}
        for rep in range(args.repeats):
            for s, classes in (runs if rep % 2 == 0 else list(reversed(runs))):
                name = s.name if classes or s.name != "everycycle" else "everycycle-no-priority"
                before = s.metrics() if s.name.startswith("everycycle") else None
                sampler = ParkedPeak(s) if before is not None else None
                result = run_team(stream_chat, percentile, s.port, model_id, batch=args.team_batch, users=args.sessions,
                                  turns=args.turns, batch_tokens=args.max_tokens, chat_tokens=args.team_chat_tokens,
                                  bias=bias, tag=f"{rep}-{name}", classes=classes, think_s=args.team_think_s)
                if before is not None:
                    after = s.metrics()
                    result["preempted"] = after.get("everycycle_requests_preempted_total", 0) - before.get(
                        "everycycle_requests_preempted_total", 0)
                    result["parked_bytes_peak"] = sampler.stop()
                raw.setdefault(name, []).append(result)
                print(f"  rep {rep + 1} team {name:<24} people during the flood ({result['interactive_during_flood']}):"
                      f" ttft p50 {fmt(result['interactive_ttft_p50_s'])} p95 {fmt(result['interactive_ttft_p95_s'])}"
                      f"  all {fmt(result['interactive_all_ttft_p50_s'])}  batch {result['batch_tok_s'] or 0:.1f}"
                      f" tok/s in {result['batch_wall_s']} s  preempted {result.get('preempted', '-')}  errors "
                      f"{result['errors']}", file=sys.stderr)
            for s in servers:  # the floor: the people alone
                floor.setdefault(s.name, []).append(run_team(
                    stream_chat, percentile, s.port, model_id, batch=0, users=args.sessions, turns=args.turns,
                    batch_tokens=args.max_tokens, chat_tokens=args.team_chat_tokens, bias=bias,
                    tag=f"{rep}-{s.name}-idle", flood=False, think_s=args.team_think_s))

        def med(runs_: list[dict], key: str):
            values = [r[key] for r in runs_ if r.get(key) is not None]
            return statistics.median(values) if values else None

        table = {name: {k: med(rs, k) for k in ("interactive_ttft_p50_s", "interactive_ttft_p95_s",
                                                 "interactive_all_ttft_p50_s", "interactive_during_flood",
                                                 "batch_tok_s", "flood_all_tok_s", "people_token_share",
                                                 "batch_wall_s", "preempted")}
                 | {"errors": sum(r["errors"] for r in rs)}
                 for name, rs in raw.items()}
        for name, rs in raw.items():
            peaks = [r["parked_bytes_peak"] for r in rs if r.get("parked_bytes_peak") is not None]
            if peaks:
                table[name]["parked_bytes_peak"] = {t: max(p.get(t, 0) for p in peaks) for p in peaks for t in p}
        idle = {name: med(rs, "interactive_ttft_p50_s") for name, rs in floor.items()}

        def ratio(a, b):
            return a / b if a is not None and b else None

        on, off, ref = table.get("everycycle"), table.get("everycycle-no-priority"), table.get("llama-server")
        ratios = {}
        if on and off:
            ratios["interactive_ttft_p50_vs_no_priority"] = ratio(on["interactive_ttft_p50_s"],
                                                                  off["interactive_ttft_p50_s"])
            ratios["batch_tok_s_vs_no_priority"] = ratio(on["batch_tok_s"], off["batch_tok_s"])
            # The batch's share shrinks by what the people get; this one counts both.
            ratios["flood_all_tok_s_vs_no_priority"] = ratio(on["flood_all_tok_s"], off["flood_all_tok_s"])
        if on and ref:
            ratios["interactive_ttft_p50_vs_llama_server"] = ratio(on["interactive_ttft_p50_s"],
                                                                   ref["interactive_ttft_p50_s"])
            ratios["batch_tok_s_vs_llama_server"] = ratio(on["batch_tok_s"], ref["batch_tok_s"])
        if on:
            ratios["interactive_ttft_p50_vs_idle"] = ratio(on["interactive_ttft_p50_s"], idle.get("everycycle"))
        spreads = {}
        if raw.get("everycycle") and raw.get("everycycle-no-priority"):
            spreads["interactive_ttft_p50_vs_no_priority"] = paired_ratio(raw["everycycle"],
                                                                          raw["everycycle-no-priority"],
                                                                          "interactive_ttft_p50_s")
            for key in ("batch_tok_s", "flood_all_tok_s"):
                spreads[f"{key}_vs_no_priority"] = paired_ratio(raw["everycycle"], raw["everycycle-no-priority"], key)
        if raw.get("everycycle") and raw.get("llama-server"):
            spreads["interactive_ttft_p50_vs_llama_server"] = paired_ratio(raw["everycycle"], raw["llama-server"],
                                                                           "interactive_ttft_p50_s")
        return {"workload": "team",
                "team": {"batch_requests": args.team_batch, "batch_answer_tokens": args.max_tokens,
                         "users": args.sessions, "turns_per_user": args.turns, "think_s": args.team_think_s,
                         "chat_answer_tokens": args.team_chat_tokens, "servers": table,
                         "idle_interactive_ttft_p50_s": idle, "runs": raw_summary(raw)},
                "ratios": {"team": ratios}, "ratio_spreads": {"team": spreads}}
    finally:
        for s in servers:
            s.stop()


def raw_summary(raw: dict[str, list[dict]]) -> dict:
    return {name: [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()} for r in runs]
            for name, runs in raw.items()}


def step_profile(before: dict, after: dict, wall: float) -> dict:
    """Where EveryCycle's time went during one run, from its own counters."""
    d = {k: after.get(f"everycycle_{k}", 0) - before.get(f"everycycle_{k}", 0)
         for k in ("n_decode_total", "n_busy_slots_total", "prompt_seconds_total", "predicted_seconds_total",
                   "tokens_predicted_total", "n_decode_generated_total", "n_busy_slots_generated_total")}
    generated_calls = d["n_decode_generated_total"]
    decode_s = d["prompt_seconds_total"] + d["predicted_seconds_total"]
    def spec(name: str, figures: dict) -> float:  # summed over the drafting kinds (label `kind`)
        return sum(v for k, v in figures.items() if k.split("{")[0] == f"everycycle_{name}")

    drafted = spec("spec_draft_tokens_total", after) - spec("spec_draft_tokens_total", before)
    accepted = spec("spec_accepted_tokens_total", after) - spec("spec_accepted_tokens_total", before)
    return {"decode_share_of_wall": decode_s / wall if wall else 0.0,
            "spec_drafted_per_generated_token": drafted / d["tokens_predicted_total"] if d["tokens_predicted_total"] else 0.0,
            "spec_acceptance": accepted / drafted if drafted else 0.0,
            "tokens_per_decode_call": d["tokens_predicted_total"] / d["n_decode_total"] if d["n_decode_total"] else 0.0,
            "mean_sequences_per_decode_call": d["n_busy_slots_total"] / d["n_decode_total"] if d["n_decode_total"] else 0.0,
            "decode_calls_per_s": d["n_decode_total"] / wall if wall else 0.0,
            "mean_ms_per_decode_call": 1000 * decode_s / d["n_decode_total"] if d["n_decode_total"] else 0.0,
            # the calls of generated tokens only, apart from prompt chunks: their mean size and time
            "ms_per_generated_only_call": 1000 * d["predicted_seconds_total"] / generated_calls if generated_calls
            else 0.0,
            "sequences_per_generated_only_call": d["n_busy_slots_generated_total"] / generated_calls if generated_calls
            else 0.0}


def prefix_mode(args, model: str, model_id: str, workdir: Path) -> dict:
    """TTFT of a ~1,000-token shared system prompt: miss, then hits from RAM and from disk."""
    py = sys.executable
    ports = {"ram": free_port(), "disk": free_port()}
    common = ["--model", model, "--threads", str(args.threads), "--parallel", "1", "--ctx-size", "2048"]
    servers = {
        "ram": Server("everycycle-ram", [py, "-m", "host_runtime.cli", "serve", "--port", str(ports["ram"]), *common,
                                         "--run-dir", str(workdir / "prefix-ram")], ports["ram"], "/ready"),
        "disk": Server("everycycle-disk", [py, "-m", "host_runtime.cli", "serve", "--port", str(ports["disk"]),
                                           *common, "--prefix-cache-ram-mib", "0", "--run-dir",
                                           str(workdir / "prefix-disk")], ports["disk"], "/ready"),
    }
    all_ready(list(servers.values()))
    system = " ".join([PARAGRAPH] * 11)  # ~1,000 tokens

    def ask(port: int, prefix: str | None, question: str) -> float:
        messages = [{"role": "system", "content": prefix + system}] if prefix is not None else []
        r = stream_chat(port, {"model": model_id, "stream": True, "temperature": 0, "max_tokens": 1,
                               "messages": messages + [{"role": "user", "content": question}]})
        if "error" in r:
            raise SystemExit(f"prefix benchmark request failed: {r['error']}")
        return r["ttft"]

    figures: dict[str, list] = {"miss": [], "ram_hit": [], "disk_hit": []}
    hits = {"ram": 0.0, "disk": 0.0}
    try:
        for rep in range(args.repeats):
            for tier, s in servers.items():
                before = s.metrics()
                prefix = f"Session {uuid.uuid4().hex}. "  # a new system prompt each time: the first ask is a miss
                miss = ask(s.port, prefix, "What are the opening hours?")
                # A short unrelated prompt takes the only slot: the system prompt's KV leaves the context.
                ask(s.port, None, f"Unrelated {uuid.uuid4().hex}: name a colour.")
                time.sleep(1.0)  # let the disk tier's background write finish
                hit = ask(s.port, prefix, "How do I donate a bicycle?")
                after = s.metrics()
                hits[tier] += after.get(f'everycycle_prefix_cache_hits_total{{tier="{tier}"}}', 0) - \
                    before.get(f'everycycle_prefix_cache_hits_total{{tier="{tier}"}}', 0)
                figures["miss"].append(miss)
                figures[f"{tier}_hit"].append(hit)
                print(f"  rep {rep + 1} {tier:<4} miss {miss * 1000:7.1f} ms  hit {hit * 1000:7.1f} ms",
                      file=sys.stderr)
    finally:
        for s in servers.values():
            s.stop()
    med = {k: statistics.median(v) for k, v in figures.items()}
    return {"miss_ttft_s": med["miss"], "ram_hit_ttft_s": med["ram_hit"], "disk_hit_ttft_s": med["disk_hit"],
            "ram_hit_speedup": med["miss"] / med["ram_hit"], "disk_hit_speedup": med["miss"] / med["disk_hit"],
            "hits_counted": hits, "repeats": args.repeats}


def fmt(v: float | None) -> str:
    return f"{v * 1000:7.1f} ms" if v is not None else "    n/a"


def main() -> int:
    from host_runtime.engine.model import default_model_path, model_id_for

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--llama-server", help="path to the llama-server binary (make bench-ref builds it)")
    p.add_argument("--model", default=None, help="GGUF (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--servers", default="everycycle,everycycle-mixed,llama-server,llama-cpp-python",
                   help="any of everycycle, everycycle-mixed, everycycle-spec (--speculation ngram), "
                        "everycycle-spec-always (the same with --draft-always), everycycle-draft (--speculation "
                        "draft), llama-server, llama-server-spec (its n-gram speculation), llama-server-draft (its "
                        "--model-draft), llama-cpp-python")
    p.add_argument("--draft-max", type=int, default=12, metavar="N",
                   help="everycycle-spec's and everycycle-draft's serve --draft-max (llama-server keeps its defaults)")
    p.add_argument("--draft-model", metavar="PATH",
                   help="the draft model of everycycle-draft and llama-server-draft (default: --model itself, "
                        "which measures the mechanism's cost, not a speed-up)")
    p.add_argument("--team-batch", type=int, default=64, help="team: the batch job's requests, sent at once")
    p.add_argument("--team-chat-tokens", type=int, default=32, help="team: the people's answer tokens")
    p.add_argument("--team-think-s", type=float, default=1.0,
                   help="team: a person's pause between an answer and their next request (default 1 s)")
    p.add_argument("--workload", choices=["chat", "code-edit", "agent", "team"], default="chat",
                   help="chat: a short paragraph and its answer; code-edit: a file and the whole edited file back; "
                        "agent: coding-agent sessions sharing a long system prompt (bench/agent_workload.py; "
                        "defaults to a random-weight SmolLM2-shaped model trained for 32,768 tokens, 4 sequences of "
                        "32,768, answers of 128 tokens); team: a batch flood (--team-batch requests, answers of "
                        "--max-tokens, default 128) while --sessions people chat, --turns requests each "
                        "(bench/team_workload.py)")
    p.add_argument("--sessions", type=int, default=4, help="agent: concurrent sessions; team: people chatting")
    p.add_argument("--turns", type=int, default=5, help="agent: turns per session; team: requests per person")
    p.add_argument("--turn-interval", type=float, default=0.0, metavar="S",
                   help="agent: send turns on a schedule the same for every server (session s's turn t at "
                        "s*S/sessions + t*S seconds, or when its last answer ends if later); 0: closed loop")
    p.add_argument("--system-tokens", type=int, default=12000, help="agent: the shared system prompt's size")
    p.add_argument("--turn-words", type=int, default=520,
                   help="agent: words of each turn's tool result (about 870 tokens with SmolLM2's tokenizer)")
    p.add_argument("--cache-type", default="f16", help="agent: the KV cache type of every server (K and V)")
    p.add_argument("--baseline-checkout", metavar="DIR",
                   help="also run everycycle (default mode) from this checkout (e.g. `git worktree add DIR HEAD~3`), "
                        "reported as everycycle-baseline with the ratio everycycle/everycycle-baseline")
    p.add_argument("--levels", default="1,4,8,16")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--requests-per-client", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=None, help="answer tokens (default 64; agent: 128)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    p.add_argument("--decode-threads", type=int, default=0, metavar="N",
                   help="everycycle's serve --decode-threads (0: its default)")
    p.add_argument("--parallel", type=int, default=None,
                   help="sequences/slots for the batching servers (default 16; agent: --sessions)")
    p.add_argument("--ctx-size", type=int, default=None, help="context per sequence (default 1024; agent: 32768)")
    p.add_argument("--mode", choices=["all", "serving", "prefix"], default="all")
    p.add_argument("--json", metavar="PATH", help="also write the JSON document here")
    p.add_argument("--api-key", help="bearer key for servers that require one")
    p.add_argument("--gpu-layers", type=int, metavar="N",
                   help="offload N layers in every server (default: each server's own default placement)")
    args = p.parse_args()
    global API_KEY
    if args.api_key:
        API_KEY = args.api_key
    if any(n.startswith("llama-server") for n in args.servers.split(",")) and args.mode != "prefix":
        if not args.llama_server or not Path(args.llama_server).exists():
            p.error("--llama-server: give the binary's path (make bench-ref builds it), or leave it out of --servers")
    agent = args.workload == "agent"
    if args.max_tokens is None:
        args.max_tokens = 128 if agent or args.workload == "team" else 64
    if args.parallel is None:
        args.parallel = args.sessions if agent else 16
    if args.ctx_size is None:
        args.ctx_size = 32768 if agent else 1024
    workdir = Path(tempfile.mkdtemp(prefix="everycycle-bench-"))
    if args.model:
        model = str(Path(args.model).resolve())
    else:
        model = agent_model(workdir) if agent else str(default_model_path())
    model_id = model_id_for(model)
    bias = {str(t): -100 for t in end_of_generation_ids(model)}
    doc: dict = {"config": {"model": model_id, "threads": args.threads, "decode_threads": args.decode_threads, "parallel": args.parallel,
                            "ctx_size_per_sequence": args.ctx_size, "max_tokens": args.max_tokens,
                            "requests_per_client": args.requests_per_client, "repeats": args.repeats,
                            "workload": args.workload, "servers": args.servers.split(","),
                            "draft_max": args.draft_max, "draft_model": model_id_for(args.draft_model or model),
                            "suppressed_tokens": sorted(int(t) for t in bias), "cpu": cpu_name(), "cpu_flags": cpu_flags(),
                            "python": platform.python_version(), "started": time.strftime("%Y-%m-%dT%H:%M:%S")}}
    try:
        if agent:
            doc["config"]["model_note"] = ("random weights of SmolLM2-135M's architecture, trained context 32,768 "
                                           "(its text is nonsense; its work per token is real)" if not args.model
                                           else "given by --model")
            doc.update(agent_mode(args, model, model_id, bias, workdir))
        elif args.workload == "team":
            doc.update(team_mode(args, model, model_id, bias, workdir))
        elif args.mode in ("all", "serving"):
            doc.update(serving_mode(args, model, model_id, bias, workdir))
        if args.mode in ("all", "prefix") and not agent and args.workload != "team":
            doc["prefix_cache"] = prefix_mode(args, model, model_id, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    text = json.dumps(doc, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 0


def cpu_name() -> str:
    try:
        m = re.search(r"model name\s*:\s*(.+)", Path("/proc/cpuinfo").read_text())
        return m.group(1).strip() if m else platform.processor()
    except OSError:
        return platform.processor()


if __name__ == "__main__":
    sys.exit(main())
