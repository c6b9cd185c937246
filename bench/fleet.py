"""The fleet gateway against round-robin over the same boxes: a multi-turn workload with shared prefixes.

Three boxes (network namespaces, `everycycle serve` on 1 thread each, the built-in model) behind the gateway
(tests/fleet_hosts.py), run twice on fresh boxes: once with the router's cache_aware policy fed by our
controller (the gateway as shipped), once with round_robin (the reference). Several conversations run at once,
each turn extending the last (a long system prompt of its own, then user and assistant turns). Measured:
- prefix hit ratio: prompt tokens the boxes' prefix caches served / all prompt tokens (everycycle_prompt_tokens_
  cached_total and everycycle_prompt_tokens_total, summed over the boxes, before and after);
- TTFT p50 and p95 (client side, streaming), and generated tokens per second over the run.
Prints one JSON document (and writes it with --json PATH): `gateway`, `round_robin`, and `ratios`.
Needs root (namespaces). Usage: sudo .venv/bin/python bench/fleet.py [--conversations 9] [--turns 4] [--json F]"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx2  # noqa: E402
import openai  # noqa: E402

from tests.fleet_hosts import SMOL, box_metric, start_fleet  # noqa: E402

TOPICS = ["a lighthouse keeper", "a bakery in Lyon", "the rings of Saturn", "a chess club", "river otters",
          "an old typewriter", "the Silk Road", "a mountain railway", "honeybees", "a jazz trio", "desert tortoises",
          "a paper mill"]


def system_prompt(n: int) -> str:
    topic = TOPICS[n % len(TOPICS)]
    facts = " ".join(f"Fact {i} about {topic}: it is remembered for detail number {i * 7 + n}." for i in range(8))
    return f"You are a patient guide who only talks about {topic}. {facts} Answer briefly."


def conversation(c: openai.OpenAI, n: int, turns: int, max_tokens: int, out: list, lock: threading.Lock) -> None:
    messages = [{"role": "system", "content": system_prompt(n)}]
    for t in range(turns):
        # Each turn pastes new material (as a user quoting a document does), so the conversation's own history,
        # not the system prompt, is most of every prompt.
        notes = " ".join(f"Note {t}.{i}: entry {n * 1000 + t * 50 + i} of the log reads {TOPICS[(n + i) % 12]}."
                         for i in range(10))
        messages.append({"role": "user", "content": f"{notes} Question {t + 1}: what stands out?"})
        start = time.monotonic()
        first = None
        text = []
        stream = c.chat.completions.create(model=SMOL, messages=messages, max_tokens=max_tokens, temperature=0,
                                           stream=True)
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                if first is None:
                    first = time.monotonic() - start
                text.append(chunk.choices[0].delta.content)
        with lock:
            out.append({"ttft_s": first, "chars": len("".join(text)), "turn": t})
        messages.append({"role": "assistant", "content": "".join(text)})


def counters(fleet) -> tuple[float, float, float]:
    cached = sum(box_metric(fleet, i, "everycycle_prompt_tokens_cached_total") for i in range(len(fleet.boxes)))
    computed = sum(box_metric(fleet, i, "everycycle_prompt_tokens_total") for i in range(len(fleet.boxes)))
    generated = sum(box_metric(fleet, i, "everycycle_tokens_predicted_total") for i in range(len(fleet.boxes)))
    return cached, computed, generated


def run(policy: str, conversations: int, turns: int, max_tokens: int) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"bench-fleet-{policy}-") as tmp:
        fleet = start_fleet(Path(tmp), [None, None, None], policy=policy, parallel=4, max_queue=256, ctx_size=2048)
        try:
            c = openai.OpenAI(base_url=fleet.url + "/v1", api_key=fleet.client_key, max_retries=0, timeout=300,
                              http_client=httpx2.Client(verify=fleet.tls()))
            before = counters(fleet)
            results: list[dict] = []
            lock = threading.Lock()
            start = time.monotonic()
            with ThreadPoolExecutor(max_workers=conversations) as pool:
                list(pool.map(lambda n: conversation(c, n, turns, max_tokens, results, lock), range(conversations)))
            wall = time.monotonic() - start
            after = counters(fleet)
            per_box = [box_metric(fleet, i, "everycycle_requests_total") for i in range(len(fleet.boxes))]
        finally:
            fleet.stop()
    cached, computed, generated = (a - b for a, b in zip(after, before))
    ttfts = sorted(r["ttft_s"] for r in results if r["ttft_s"] is not None)
    return {"policy": policy, "requests": len(results), "wall_s": round(wall, 2),
            "prefix_hit_ratio": round(cached / (cached + computed), 4) if cached + computed else 0.0,
            "prompt_tokens_cached": int(cached), "prompt_tokens_computed": int(computed),
            "ttft_p50_s": round(statistics.median(ttfts), 4),
            "ttft_p95_s": round(ttfts[min(len(ttfts) - 1, int(0.95 * len(ttfts)))], 4),
            "tok_s": round(generated / wall, 2), "requests_per_box": [int(x) for x in per_box]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--conversations", type=int, default=9)
    p.add_argument("--turns", type=int, default=5)
    p.add_argument("--max-tokens", type=int, default=24)
    p.add_argument("--json", type=Path, help="write the result here too")
    args = p.parse_args()
    gateway = run("cache_aware", args.conversations, args.turns, args.max_tokens)
    round_robin = run("round_robin", args.conversations, args.turns, args.max_tokens)
    doc = {"bench": "fleet", "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "machine": {"cpus": __import__("os").cpu_count(), "python": platform.python_version()},
           "workload": {"boxes": 3, "threads_per_box": 1, "conversations": args.conversations,
                        "turns": args.turns, "max_tokens": args.max_tokens, "model": SMOL},
           "gateway": gateway, "round_robin": round_robin,
           "ratios": {
               "prefix_hit_ratio_vs_round_robin": round(gateway["prefix_hit_ratio"] / round_robin["prefix_hit_ratio"], 3)
               if round_robin["prefix_hit_ratio"] else None,
               "ttft_p50_vs_round_robin": round(gateway["ttft_p50_s"] / round_robin["ttft_p50_s"], 3),
               "tok_s_vs_round_robin": round(gateway["tok_s"] / round_robin["tok_s"], 3)}}
    text = json.dumps(doc, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
