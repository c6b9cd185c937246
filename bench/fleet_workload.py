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
        with lock:
            out.append({"ttft_s": first, "chars": len("".join(text)), "turn": t})
        messages.append({"role": "assistant", "content": "".join(text)})
