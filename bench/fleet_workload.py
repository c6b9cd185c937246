"""The fleet benchmark's workload (standard library only, so that the LiteLLM client's own venv runs it too):
several conversations at once, each turn extending the last, with a long system prompt of its own."""

from __future__ import annotations

import threading
import time
from typing import Callable, Iterable

TOPICS = ["a lighthouse keeper", "a bakery in Lyon", "the rings of Saturn", "a chess club", "river otters",
          "an old typewriter", "the Silk Road", "a mountain railway", "honeybees", "a jazz trio", "desert tortoises",
          "a paper mill"]


def system_prompt(n: int) -> str:
    topic = TOPICS[n % len(TOPICS)]
    facts = " ".join(f"Fact {i} about {topic}: it is remembered for detail number {i * 7 + n}." for i in range(8))
    return f"You are a patient guide who only talks about {topic}. {facts} Answer briefly."


def conversation(send: Callable[[list[dict]], Iterable[str | None]], n: int, turns: int, out: list,
                 lock: threading.Lock) -> None:
    """`send(messages)` streams one answer's text pieces through the router under test."""
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
        for piece in send(messages):
            if piece:
                if first is None:
                    first = time.monotonic() - start
                text.append(piece)
        with lock:  # ended: the monotonic clock (one per machine: the LiteLLM client's process shares it)
            out.append({"ttft_s": first, "chars": len("".join(text)), "turn": t, "ended": time.monotonic()})
        messages.append({"role": "assistant", "content": "".join(text)})


# The heterogeneous fleet's sessions (bench/fleet.py --fleet hetero), by session number: a multi-turn chat on the
# common model, a run of one-shot long prompts on it (a document to summarise each time: no prefix to reuse but the
# instructions), and a chat on the model that only some boxes hold.
SESSION_KINDS = ("chat", "one-shot", "other-model")


def long_document(n: int, t: int) -> str:
    return " ".join(f"Paragraph {i}: the {TOPICS[(n + t + i) % 12]} report for week {t} lists item {n * 97 + i}, "
                    f"which was checked, filed and sent on." for i in range(24))


def mixed_session(send: Callable[[list[dict], str], Iterable[str | None]], n: int, turns: int, out: list,
                  lock: threading.Lock, common_model: str, other_model: str) -> None:
    """Session n of the mixed workload; `send(messages, model)` streams one answer through the router under test.
    Each result says its session's kind."""
    kind = SESSION_KINDS[n % len(SESSION_KINDS)]
    if kind != "one-shot":
        model = common_model if kind == "chat" else other_model
        tagged: list = []
        conversation(lambda messages: send(messages, model), n, turns, tagged, threading.Lock())
        with lock:
            out.extend({**r, "kind": kind} for r in tagged)
        return
    for t in range(turns):
        messages = [{"role": "system", "content": "You summarise documents in one sentence."},
                    {"role": "user", "content": f"{long_document(n, t)} Summarise this."}]
        start = time.monotonic()
        first, chars = None, 0
        for piece in send(messages, common_model):
            if piece:
                if first is None:
                    first = time.monotonic() - start
                chars += len(piece)
        with lock:
            out.append({"ttft_s": first, "chars": chars, "turn": t, "kind": kind, "ended": time.monotonic()})
