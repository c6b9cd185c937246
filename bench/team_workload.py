"""The team workload of bench/serving.py (issue 38): a box shared by people and a batch job.

A nightly batch job floods the box with BATCH requests at once (long answers, `"priority": "batch"` in the body:
EveryCycle's own field, which a request may use to lower its class, never to raise it); after a short head start,
USERS people chat, each sending one short request after another with a pause between (the next one after the
last answer ends), TURNS each and on for as long as the flood lasts. Measured: the people's TTFT (p50, p95) over
the requests they sent while the flood ran (the experience the classes are for; a server that finishes the flood
sooner also serves people idle sooner, so all requests' TTFT is reported beside it), and the batch's aggregate
tok/s over the time it took;
run with the field (priority classes on), without it (classes off: every request of one class) and against
llama-server, which has no classes and queues first come, first served. The people's idle TTFT (no flood) is the
floor the flood's should approach.
"""

from __future__ import annotations

import threading
import time


def batch_body(model_id: str, i: int, tag: str, max_tokens: int, bias: dict, classes: bool) -> dict:
    body = {"model": model_id, "stream": True, "max_tokens": max_tokens, "temperature": 0, "logit_bias": bias,
            "messages": [{"role": "user", "content": f"Document {tag}-{i}: summarise the quarterly report of "
                                                     f"department {i} in detail, section by section."}]}
    if classes:
        body["priority"] = "batch"
    return body


def chat_body(model_id: str, user: int, turn: int, tag: str, max_tokens: int, bias: dict) -> dict:
    return {"model": model_id, "stream": True, "max_tokens": max_tokens, "temperature": 0, "logit_bias": bias,
            "messages": [{"role": "user", "content": f"({tag} user {user} turn {turn}) What is a good name for "
                                                     "a small bicycle repair shop?"}]}


def run_team(stream_chat, percentile, port: int, model_id: str, *, batch: int, users: int, turns: int,
             batch_tokens: int, chat_tokens: int, bias: dict, tag: str, classes: bool = True,
             head_start_s: float = 2.0, think_s: float = 1.0, flood: bool = True) -> dict:
    """One run: the flood (unless flood=False: the people alone, the floor) and the people; stream_chat(port,
    body) -> dict is bench/serving.py's one streamed request."""
    batch_results: list[dict] = []
    chat_results: list[dict] = []
    lock = threading.Lock()

    flood_done = threading.Event()  # set by the flood's last answer
    if not flood or batch == 0:
        flood_done.set()

    def one_batch(i: int) -> None:
        r = stream_chat(port, batch_body(model_id, i, tag, batch_tokens, bias, classes))
        with lock:
            batch_results.append(r)
            if len(batch_results) == batch:
                flood_done.set()

    def person(u: int) -> None:
        t = 0
        while t < turns or not flood_done.is_set():
            r = stream_chat(port, chat_body(model_id, u, t, tag, chat_tokens, bias))
            with lock:
                chat_results.append(r)
            t += 1
            time.sleep(think_s)

    started = time.perf_counter()
    flood_threads = [threading.Thread(target=one_batch, args=(i,)) for i in range(batch if flood else 0)]
    for th in flood_threads:
        th.start()
    time.sleep(head_start_s if flood else 0)
    people = [threading.Thread(target=person, args=(u,)) for u in range(users)]
    for th in people:
        th.start()
    for th in people + flood_threads:
        th.join()
    ok_chat = [r for r in chat_results if "error" not in r]
    ok_batch = [r for r in batch_results if "error" not in r]
    flood_end = max(r["end"] for r in ok_batch) if ok_batch else None
    during = [r for r in ok_chat if flood_end is not None and r["start"] < flood_end]
    batch_wall = (flood_end - started) if ok_batch else None
    batch_tokens_done = sum(r["tokens"] for r in ok_batch)
    people_tokens = sum(r["tokens"] for r in during)
    errors = [r["error"] for r in chat_results + batch_results if "error" in r]

    def ttft(rs: list[dict], q: float):
        return percentile([r["ttft"] for r in rs], q) if rs else None

    return {"interactive_ttft_p50_s": ttft(during if flood else ok_chat, 0.5),
            "interactive_ttft_p95_s": ttft(during if flood else ok_chat, 0.95),
            "interactive_during_flood": len(during),
            # Everything generated while the flood ran, the people's answers too: what the box did in that time.
            "flood_all_tok_s": (batch_tokens_done + people_tokens) / batch_wall if batch_wall else None,
            # The people's part of it: the batch's tok/s against a run where they waited is at most 1 - this.
            "people_token_share": (people_tokens / (batch_tokens_done + people_tokens)
                                   if batch_tokens_done + people_tokens else None),
            "interactive_all_ttft_p50_s": ttft(ok_chat, 0.5),
            "interactive_requests": len(chat_results),
            "batch_tok_s": batch_tokens_done / batch_wall if batch_wall else None,
            "batch_wall_s": round(batch_wall, 2) if batch_wall else None, "batch_requests": len(batch_results),
            "batch_tokens": batch_tokens_done, "errors": len(errors), **({"error_sample": errors[:2]} if errors else {})}
