#!/usr/bin/env python3
"""How long a streaming answer stalls while another request's long prompt is computed (prints JSON).

One answer streams (its end tokens suppressed, so it outlasts the other); once it has sent 20 tokens a second
client sends a long prompt (--prompt-tokens of text, a unique start so no cache serves it) for one token. Measured
on the answer, over the gaps between its tokens from the long prompt's send to its first token: the longest gap
and the 95th percentile; and the long prompt's TTFT (what cutting the steps costs it). Each server runs
--repeats times, the order reversed every other repeat, each ratio paired by repeat (median and range).

Servers: `everycycle` (this checkout), `everycycle-baseline` (--baseline-checkout DIR: another checkout, this
venv; e.g. `git worktree add DIR HEAD~1`) and `llama-server` (--llama-server PATH; its default batch, 2,048 prompt
tokens a step in 512-token calls), all with 2 sequences of --ctx-size tokens and --threads threads.

  bench/prefill_stall.py [--servers everycycle,everycycle-baseline,llama-server] [--baseline-checkout DIR]
                         [--llama-server PATH] [--prompt-tokens 6000] [--repeats 3] [--json F]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from serving import (PARAGRAPH, Server, cpu_flags, cpu_name, end_of_generation_ids, free_port,  # noqa: E402
                     paired_ratio, percentile, spread, stream_chat)

from host_runtime.engine.model import default_model_path  # noqa: E402

ANSWER_LEAD = 20  # the answer's tokens before the long prompt is sent


def start(name: str, args, model: str, workdir: Path) -> Server:
    port = free_port()
    if name.startswith("everycycle"):
        base = Path(args.baseline_checkout).resolve() if name == "everycycle-baseline" else None
        argv = [sys.executable, "-m", "host_runtime.cli", "serve", "--port", str(port), "--model", model,
                "--threads", str(args.threads), "--parallel", "2", "--ctx-size", str(args.ctx_size),
                "--run-dir", str(workdir / name)]
        return Server(name, argv, port, "/ready", **({"env": {**os.environ, "PYTHONPATH": str(base)}, "cwd": base}
                                                     if base else {}))
    argv = [args.llama_server, "-m", model, "--host", "127.0.0.1", "--port", str(port), "-t", str(args.threads),
            "-tb", str(args.threads), "-np", "2", "-c", str(2 * args.ctx_size), "--alias", "m", "--no-webui"]
    return Server(name, argv, port, "/health")


def one_run(server: Server, model_id: str, bias: dict, prompt_tokens: int) -> dict:
    answer_body = {"model": model_id, "stream": True, "temperature": 0, "max_tokens": 4000, "logit_bias": bias,
                   "messages": [{"role": "user", "content": f"[{uuid.uuid4().hex[:12]}] Tell a long story."}]}
    # About 75 tokens a PARAGRAPH with SmolLM2's tokenizer.
    document = " ".join([PARAGRAPH] * max(1, prompt_tokens // 75))
    long_body = {"model": model_id, "stream": True, "temperature": 0, "max_tokens": 1,
                 "stream_options": {"include_usage": True},
                 "messages": [{"role": "user", "content": f"[{uuid.uuid4().hex[:12]}] {document} Summarise."}]}
    times: list[float] = []
    stop = threading.Event()

    def answer() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=600)
        conn.request("POST", "/v1/chat/completions", body=json.dumps(answer_body),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        while not stop.is_set():
            line = resp.fp.readline()
            if not line or line.strip() == b"data: [DONE]":
                break
            if line.startswith(b"data: {") and b'"content":"' in line and b'"content":""' not in line:
                times.append(time.perf_counter())
        conn.close()

    reader = threading.Thread(target=answer, daemon=True)
    reader.start()
    deadline = time.monotonic() + 120
    while len(times) < ANSWER_LEAD and time.monotonic() < deadline:
        time.sleep(0.01)
    if len(times) < ANSWER_LEAD:
        raise SystemExit(f"{server.name}: the answer sent {len(times)} tokens in 120 s; log: {server.log.name}")
    long = stream_chat(server.port, long_body)
    if "error" in long:
        raise SystemExit(f"{server.name}: the long prompt failed: {long['error']}; log: {server.log.name}")
    sent, first = long["start"], long["start"] + long["ttft"]
    time.sleep(1.0)  # the gap that spans the prompt's end closes after it
    stop.set()
    reader.join(timeout=30)
    # the answer's gaps that ended while the long prompt was computed (or just after: the one spanning its end)
    gaps = [b - a for a, b in zip(times, times[1:]) if sent < b <= first + 0.5]
    return {"long_ttft_s": round(long["ttft"], 3), "long_prompt_tokens": long.get("prompt_tokens"),
            "answer_tokens_during": len(gaps),
            **{f"answer_gap_{name}_s": round(value, 3) if value is not None else None
               for name, value in (("max", percentile(gaps, 1.0)), ("p95", percentile(gaps, 0.95)),
                                   ("p50", percentile(gaps, 0.5)))}}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--servers", default="everycycle,everycycle-baseline,llama-server")
    p.add_argument("--baseline-checkout", metavar="DIR")
    p.add_argument("--llama-server", metavar="PATH")
    p.add_argument("--model", default=None, help="GGUF (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--prompt-tokens", type=int, default=6000)
    p.add_argument("--ctx-size", type=int, default=8192, help="tokens a sequence")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    wanted = args.servers.split(",")
    if "everycycle-baseline" in wanted and not args.baseline_checkout:
        p.error("--baseline-checkout: needed for everycycle-baseline")
    if "llama-server" in wanted and not args.llama_server:
        p.error("--llama-server: needed for llama-server (make bench-ref builds it)")
    model = str(Path(args.model).resolve()) if args.model else str(default_model_path())
    bias = {str(t): -100 for t in end_of_generation_ids(model)}
    runs: dict[str, list[dict]] = {name: [] for name in wanted}
    with tempfile.TemporaryDirectory(prefix="bench-stall-") as tmp:
        servers = [start(name, args, model, Path(tmp)) for name in wanted]
        try:
            for s in servers:
                s.wait_ready()
            for rep in range(args.repeats):
                for s in servers if rep % 2 == 0 else list(reversed(servers)):
                    model_id = "m" if s.name == "llama-server" else Path(model).stem
                    result = one_run(s, model_id, bias, args.prompt_tokens)
                    runs[s.name].append(result)
                    print(f"  rep {rep + 1} {s.name:<20} gap max {result['answer_gap_max_s']} s, p95 "
                          f"{result['answer_gap_p95_s']} s; long prompt TTFT {result['long_ttft_s']} s",
                          file=sys.stderr)
        finally:
            for s in servers:
                s.stop()
    keys = ("answer_gap_max_s", "answer_gap_p95_s", "answer_gap_p50_s", "long_ttft_s")
    doc = {"bench": "prefill_stall", "when": time.strftime("%Y-%m-%dT%H:%M:%S"), "cpu": cpu_name(),
           "cpu_flags": cpu_flags(), "model": Path(model).stem, "prompt_tokens": args.prompt_tokens,
           "ctx_size": args.ctx_size, "threads": args.threads, "repeats": args.repeats,
           "servers": {name: {k: spread([r[k] for r in rs]) for k in keys} for name, rs in runs.items()},
           "ratios": {f"{name}_vs_{ref}": {k: paired_ratio(runs[name], runs[ref], k) for k in keys}
                      for name, ref in (("everycycle", "everycycle-baseline"), ("everycycle", "llama-server"))
                      if runs.get(name) and runs.get(ref)},
           "runs": runs}
    text = json.dumps(doc, indent=1)
    if args.json:
        args.json.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
