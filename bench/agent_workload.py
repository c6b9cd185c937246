"""The agent workload of bench/serving.py (issue 33): coding-agent sessions that share one long system prompt.

Four sessions (by default) share a system prompt of about 12,000 tokens (instructions and ten tool definitions,
written into the prompt as text so that every server renders the same tokens whatever its template does with
`tools`); each takes five turns, every turn adding a tool result of about 870 tokens and the answer (128
tokens) to the conversation, about 1,000 tokens a turn, as an agent's context grows. The first turn of every
session is the shared prompt plus its own message: the prefix cache's case. A new system prompt per repeat
(its first line differs), so no repeat starts warm from the one before.
"""

from __future__ import annotations

import json
import random
import re
import threading
import time

TOOLS = ("read_file", "write_file", "edit_file", "list_directory", "search_code", "run_command", "run_tests",
         "git_diff", "git_commit", "fetch_url")
WORDS = ("the", "function", "returns", "value", "module", "request", "handler", "config", "parser", "cache",
         "index", "token", "buffer", "schema", "client", "server", "queue", "thread", "error", "retry", "timeout",
         "path", "file", "test", "assert", "build", "deploy", "version", "record", "field", "update", "delete",
         "create", "list", "filter", "map", "reduce", "sort", "merge", "split", "join", "stream", "batch", "load")


def tool_definitions() -> list[dict]:
    """Ten tools in the OpenAI function format, with parameter schemas of the size agents send."""
    out = []
    for i, name in enumerate(TOOLS):
        rng = random.Random(i)
        params = {f"{w}_{j}": {"type": rng.choice(["string", "integer", "boolean"]),
                               "description": " ".join(rng.choice(WORDS) for _ in range(14))}
                  for j, w in enumerate(rng.sample(WORDS, 6))}
        out.append({"type": "function", "function": {
            "name": name, "description": f"{name.replace('_', ' ')}: " + " ".join(rng.choice(WORDS) for _ in range(40)),
            "parameters": {"type": "object", "properties": params, "required": list(params)[:2]}}})
    return out


def system_prompt(count_tokens, target_tokens: int, tag: str) -> str:
    """Instructions, the tool definitions as JSON, then guideline paragraphs until about target_tokens."""
    head = (f"[{tag}] You are a coding agent working in a repository on the user's machine. Use the tools below; "
            "answer with a tool call or a short message.\n\n# Tools\n" + json.dumps(tool_definitions(), indent=1))
    rng = random.Random(7)
    parts = [head, "\n\n# Repository guidelines\n"]
    n = count_tokens("".join(parts))
    while n < target_tokens:
        para = f"{len(parts) - 1}. " + " ".join(rng.choice(WORDS) for _ in range(60)) + ".\n"
        parts.append(para)
        n += count_tokens(para)
    return "".join(parts)


def tool_result(session: int, turn: int, tag: str, words: int) -> str:
    rng = random.Random(f"{tag}-{session}-{turn}")
    lines = [f"Tool result for session {session}, turn {turn} ({tag}): run_command output follows."]
    while sum(len(x.split()) for x in lines) < words:
        lines.append(f"src/{rng.choice(WORDS)}/{rng.choice(WORDS)}.py:{rng.randint(1, 900)}: "
                     + " ".join(rng.choice(WORDS) for _ in range(12)))
    return "\n".join(lines)


def run_sessions(stream_chat, percentile, port: int, model_id: str, system: str, *, sessions: int, turns: int,
                 max_tokens: int, bias: dict, tag: str, user_words: int, turn_interval_s: float = 0.0) -> dict:
    """Every session's turns in order, the sessions at once; stream_chat(port, body) -> its timing dict (with
    "text"), percentile(values, q) the benchmark's own. TTFT p50/p95 over every request, output tok/s over the
    whole run's wall time.

    turn_interval_s > 0: an arrival schedule the same for every server (open loop as far as it holds): session s
    sends turn t at s * interval / sessions + t * interval from the start, or when its last answer ends if that is
    later (then the turn is "late": the server could not keep the schedule). 0: each turn as soon as the last
    answer ends (closed loop: a server's own speed then shapes when sessions meet)."""
    results: list[dict] = []
    lock = threading.Lock()
    started = time.perf_counter()

    def session(si: int) -> None:
        messages = [{"role": "system", "content": system}]
        for turn in range(turns):
            if turn_interval_s > 0:
                due = started + si * turn_interval_s / sessions + turn * turn_interval_s
                wait = due - time.perf_counter()
                late = wait < 0
                if wait > 0:
                    time.sleep(wait)
            else:
                late = False
            messages.append({"role": "user", "content": tool_result(si, turn, tag, user_words)})
            body = {"model": model_id, "stream": True, "temperature": 0, "max_tokens": max_tokens,
                    "logit_bias": bias, "messages": messages, "stream_options": {"include_usage": True}}
            r = stream_chat(port, body)
            r["turn"], r["session"], r["late"] = turn, si, late
            with lock:
                results.append(r)
            if "error" in r:
                return
            messages.append({"role": "assistant", "content": r.get("text", "")})

    threads = [threading.Thread(target=session, args=(i,)) for i in range(sessions)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - started
    ok = [r for r in results if "error" not in r]
    errors = [r["error"] for r in results if "error" in r]

    first = [r["ttft"] for r in ok if r["turn"] == 0]
    later = [r["ttft"] for r in ok if r["turn"] > 0]
    return {"tok_s": sum(r["tokens"] for r in ok) / wall if ok else 0.0, "wall_s": round(wall, 2),
            "ttft_p50_s": percentile([r["ttft"] for r in ok], 0.5), "ttft_p95_s": percentile([r["ttft"] for r in ok], 0.95),
            "ttft_first_turn_p50_s": percentile(first, 0.5), "ttft_later_turns_p50_s": percentile(later, 0.5),
            "itl_p50_s": percentile([g for r in ok for g in r["gaps"]], 0.5),
            "requests": len(results), "errors": len(errors), **({"error_sample": errors[:2]} if errors else {}),
            **({"late_turns": sum(1 for r in results if r.get("late"))} if turn_interval_s > 0 else {}),
            # each request in the order sent: when (from the run's start), its TTFT, and how much of its prompt the
            # server computed (prompt - cached, where the server reported usage): what a TTFT was made of
            "per_request": [{"session": r["session"], "turn": r["turn"], "sent_s": round(r["start"] - started, 2),
                             "ttft_s": round(r["ttft"], 2), "prompt_tokens": r.get("prompt_tokens"),
                             "cached_tokens": r.get("cached_tokens")}
                            for r in sorted(ok, key=lambda r: r["start"])]}


_LLAMA_KV = re.compile(r"llama_kv_cache: size =\s*([\d.]+) MiB \(\s*(\d+) cells")


def llama_server_kv_bytes_per_token(log_text: str) -> float | None:
    """llama-server's KV cache as its log states it: MiB over cells (every layer's K and V for one token)."""
    m = _LLAMA_KV.search(log_text)
    return float(m.group(1)) * (1 << 20) / int(m.group(2)) if m else None


def everycycle_kv_bytes_per_token(metrics: dict[str, float], cells: int) -> float | None:
    """What llama.cpp allocated for EveryCycle's KV (its /metrics), over the cells it was sized for."""
    kv = sum(v for k, v in metrics.items()
             if k.startswith("everycycle_device_memory_allocated_bytes{") and 'kind="kv"' in k)
    return kv / cells if kv and cells else None
