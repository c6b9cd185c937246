"""Per API key: the tokens its requests used (prompt and generated) and when, against its tokens-per-minute and
tokens-per-day limits (pure: the caller gives the time). The engine counts a request when it ends; a key past a
limit gets a 429 until enough of its window has passed (Retry-After)."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

WINDOWS = {"minute": 60.0, "day": 86400.0}


@dataclass(frozen=True)
class Refusal:
    window: str       # minute or day
    used: int
    limit: int
    retry_after: int  # seconds until the window holds less than the limit again

    def message(self, key: str) -> str:
        return (f"the key {key!r} used {self.used:,} tokens in the last {self.window}; its limit is "
                f"{self.limit:,} a {self.window} (keys set-limit); retry in {self.retry_after} s")


class KeyLedger:
    def __init__(self):
        self._entries: dict[str, deque[tuple[float, int]]] = {}

    def add(self, key: str, tokens: int, now: float) -> None:
        entries = self._entries.setdefault(key, deque())
        entries.append((now, tokens))
        self._prune(entries, now)

    def used(self, key: str, window: str, now: float) -> int:
        start = now - WINDOWS[window]
        return sum(tokens for t, tokens in self._entries.get(key, ()) if t > start)

    def refusal(self, key: str, per_minute: int, per_day: int, now: float) -> Refusal | None:
        """Why a new request of `key` must wait (the first limit reached), or None (0: no limit)."""
        entries = self._entries.get(key)
        if not entries:
            return None
        self._prune(entries, now)
        for window, limit in (("minute", per_minute), ("day", per_day)):
            if not limit:
                continue
            used = self.used(key, window, now)
            if used >= limit:
                return Refusal(window, used, limit, self._wait(entries, window, limit, now))
        return None

    @staticmethod
    def _wait(entries, window: str, limit: int, now: float) -> int:
        """Seconds until what the window holds drops below the limit, as its oldest entries leave it."""
        start = now - WINDOWS[window]
        inside = [(t, tokens) for t, tokens in entries if t > start]
        held = sum(tokens for _, tokens in inside)
        for t, tokens in inside:
            held -= tokens
            if held < limit:
                return max(1, math.ceil(t + WINDOWS[window] - now))
        return max(1, math.ceil(WINDOWS[window]))

    @staticmethod
    def _prune(entries: deque, now: float) -> None:
        while entries and entries[0][0] <= now - WINDOWS["day"]:
            entries.popleft()
