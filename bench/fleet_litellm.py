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

from fleet_workload import conversation, mixed_session  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--box", action="append", required=True,
                   help="a box's API base URL, =MODEL,MODEL for the models it holds (repeatable)")
    p.add_argument("--other-model", help="the hetero fleet's mixed workload, with this as its second model")
    p.add_argument("--key", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--strategy", default="least-busy")
    p.add_argument("--conversations", type=int, default=9)
    p.add_argument("--turns", type=int, default=5)
    p.add_argument("--max-tokens", type=int, default=24)
    a = p.parse_args()
    litellm.telemetry = False
    deployments = []
    for box in a.box:
        base, _, held = box.partition("=")
        for model in (held.split(",") if held else [a.model]):  # one deployment per (box, model), named by model
            deployments.append({"model_name": model, "litellm_params": {
                "model": f"openai/{model}", "api_base": base.rstrip("/") + "/v1", "api_key": a.key}})
    router = litellm.Router(model_list=deployments, routing_strategy=a.strategy, num_retries=0)

    def send(messages, model=a.model):
        for chunk in router.completion(model=model, messages=messages, max_tokens=a.max_tokens, temperature=0,
                                       stream=True):
            if chunk.choices:
                yield chunk.choices[0].delta.content

    results, lock = [], threading.Lock()
    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=a.conversations) as pool:
        if a.other_model:
            list(pool.map(lambda n: mixed_session(send, n, a.turns, results, lock, a.model, a.other_model),
                          range(a.conversations)))
        else:
            list(pool.map(lambda n: conversation(send, n, a.turns, results, lock), range(a.conversations)))
    print(json.dumps({"litellm": litellm.__version__ if hasattr(litellm, "__version__") else "?",
                      "strategy": a.strategy, "wall_s": time.monotonic() - start, "started": start,
                      "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
