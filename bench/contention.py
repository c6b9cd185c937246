#!/usr/bin/env python3
"""Contention (#55): a streamed answer's decode speed alone, beside a busy-loop process (one core's worth), and
while a second model decodes at once, for EveryCycle and llama-server in one run, turn about. Prints JSON.

Two servers of each kind serve the same model (two engines, as two models on one box would be); each condition's
tok/s is the answer's tokens after the first over the time they took. Each repeat runs every condition for every
kind; ratios are each kind's condition over its own alone speed, with their spread over repeats, and EveryCycle's
over llama-server's.

    python bench/contention.py --llama-server PATH [--repeats 3] [--max-tokens 256] [--json OUT]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from serving import Server, cpu_flags, cpu_name, end_of_generation_ids, free_port  # noqa: E402

PROMPT = "Write a long story about a lighthouse keeper and the sea, in many short paragraphs."
CONDITIONS = ("alone", "busy_neighbour", "two_models")


def start(kind: str, args, model: str, workdir: Path, index: int) -> Server:
    """Server `index` of this kind on the model, each engine given every core (as a box's engines are)."""
    port = free_port()
    if kind == "everycycle":
        argv = [sys.executable, "-m", "host_runtime.cli", "serve", "--port", str(port), "--model", model,
                "--parallel", "1", "--ctx-size", "2048", "--run-dir", str(workdir / f"ec-{index}")]
        return Server(f"everycycle-{index}", argv, port, "/ready")
    argv = [args.llama_server, "-m", model, "--host", "127.0.0.1", "--port", str(port), "-np", "1", "-c", "2048",
            "--alias", Path(model).stem, "--no-webui"]
    return Server(f"llama-server-{index}", argv, port, "/health")


def decode_rate(port: int, body: dict, limit_s: float = 20.0) -> float | None:
    """tok/s of one streamed answer after its first token, over at most `limit_s` of streaming (a server that all
    but stops would take minutes: llama-server here decoded 0.9-1.8 tok/s beside a busy loop); None: it failed."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    times: list[float] = []
    try:
        conn.request("POST", "/v1/chat/completions", body=json.dumps(body),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            return None
        for line in resp:
            if line.startswith(b"data: {") and json.loads(line[6:])["choices"][0]["delta"].get("content"):
                times.append(time.perf_counter())
                if times[-1] - times[0] > limit_s:
                    break
    except (OSError, http.client.HTTPException, ValueError, KeyError, IndexError):
        return None
    finally:
        conn.close()  # an answer cut off by the limit is cancelled by its closed connection
    return (len(times) - 1) / (times[-1] - times[0]) if len(times) >= 3 else None


def condition(name: str, servers: list[Server], body: dict) -> list[float | None]:
    if name == "alone":
        return [decode_rate(servers[0].port, body)]
    if name == "busy_neighbour":
        busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        try:
            time.sleep(0.5)
            return [decode_rate(servers[0].port, body)]
        finally:
            busy.kill()
            busy.wait()
    rates: list[float | None] = [None, None]

    def one(i: int) -> None:
        rates[i] = decode_rate(servers[i].port, body)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return rates


def spread(values: list[float]) -> dict | None:
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3),
            "max": round(max(values), 3)} if values else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-server", help="llama-server from the same llama.cpp (make bench-ref); none: EveryCycle only")
    ap.add_argument("--model", default=None, help="GGUF (default: the embedded SmolLM2-135M-Instruct)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args()
    if args.model is None:
        from host_runtime.engine.model import default_model_path

        args.model = str(default_model_path())
    kinds = ["everycycle"] + (["llama-server"] if args.llama_server else [])
    # The answer runs its full length in every server: the end tokens are barred.
    model_id = Path(args.model).stem  # EveryCycle's name for a model file; llama-server takes it as its alias
    body = {"model": model_id, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": args.max_tokens,
            "temperature": 0, "stream": True,
            "logit_bias": {str(t): -100 for t in end_of_generation_ids(args.model)}}
    workdir = Path(tempfile.mkdtemp(prefix="bench-contention-"))
    raw: dict[str, dict[str, list[list[float | None]]]] = {k: {c: [] for c in CONDITIONS} for k in kinds}
    for repeat in range(args.repeats):
        for kind in (kinds if repeat % 2 == 0 else kinds[::-1]):
            servers = [start(kind, args, args.model, workdir, i) for i in range(2)]
            try:
                for s in servers:
                    s.wait_ready()
                decode_rate(servers[0].port, {**body, "max_tokens": 16})  # warm
                decode_rate(servers[1].port, {**body, "max_tokens": 16})
                for c in CONDITIONS:
                    raw[kind][c].append(condition(c, servers, body))
                    print(f"repeat {repeat + 1} {kind} {c}: {raw[kind][c][-1]}", file=sys.stderr)
            finally:
                for s in servers:
                    s.stop()
    doc: dict = {"cpu": cpu_name(), "cpu_flags": cpu_flags(), "cores": os.cpu_count(), "model": Path(args.model).name,
                 "max_tokens": args.max_tokens, "repeats": args.repeats, "tok_s": {}, "share_of_alone": {},
                 "everycycle_over_llama_server": {}}
    for kind in kinds:
        alone = [r[0] for r in raw[kind]["alone"]]
        doc["tok_s"][kind] = {c: [[round(x, 1) if x else None for x in r] for r in raw[kind][c]] for c in CONDITIONS}
        shares = {}
        for c in CONDITIONS[1:]:
            # each repeat's condition over that repeat's alone speed; with two models, the slower of the two
            per = [min(x or 0.0 for x in r) / a for r, a in zip(raw[kind][c], alone) if a]
            shares[c] = spread(per)
        doc["share_of_alone"][kind] = shares
    if "llama-server" in kinds:
        for c in CONDITIONS:
            per = [min(x or 0.0 for x in e) / min(x or 0.0 for x in ls) for e, ls in
                   zip(raw["everycycle"][c], raw["llama-server"][c]) if min(x or 0.0 for x in ls) > 0]
            doc["everycycle_over_llama_server"][c] = spread(per)
    text = json.dumps(doc, indent=1)
    if args.json:
        Path(args.json).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
