"""The fleet workload through LiteLLM's Router (the other router the fleet issue names), run by bench/fleet.py
inside the gateway's namespace with its own venv (litellm pinned; never installed beside the box's code).
Prints one JSON document: each request's TTFT and answer length, and the wall time."""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import litellm  # noqa: E402

from fleet_workload import conversation  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--box", action="append", required=True, help="a box's API base URL (repeatable)")
    p.add_argument("--key", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--strategy", default="least-busy")
    p.add_argument("--conversations", type=int, default=9)
    p.add_argument("--turns", type=int, default=5)
    p.add_argument("--max-tokens", type=int, default=24)
    a = p.parse_args()
    litellm.telemetry = False
    router = litellm.Router(model_list=[{"model_name": "bench", "litellm_params": {
        "model": f"openai/{a.model}", "api_base": box.rstrip("/") + "/v1", "api_key": a.key}} for box in a.box],
        routing_strategy=a.strategy, num_retries=0)

    def send(messages):
        for chunk in router.completion(model="bench", messages=messages, max_tokens=a.max_tokens, temperature=0,
                                       stream=True):
            if chunk.choices:
                yield chunk.choices[0].delta.content

    results, lock = [], threading.Lock()
    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=a.conversations) as pool:
        list(pool.map(lambda n: conversation(send, n, a.turns, results, lock), range(a.conversations)))
    print(json.dumps({"litellm": litellm.__version__ if hasattr(litellm, "__version__") else "?",
                      "strategy": a.strategy, "wall_s": time.monotonic() - start, "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
