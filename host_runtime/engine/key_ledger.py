"""Per API key: the tokens its requests used (prompt and generated) and when, against its tokens-per-minute and
tokens-per-day limits (pure: the caller gives the time, wall-clock seconds, for the ledger outlives a process). A
request is counted when it ends; a key past a limit gets a 429 until enough of its window has passed (Retry-After).

What is kept stays small whatever a key sends: uses within a second are one entry, and those past the minute
window fold into one entry a minute (stamped with their latest time, so a day's limit frees no earlier than
exactly counted): 60 + 1,440 entries a key at most. engine/key_ledger_file.py shares one among the box's
processes."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

WINDOWS = {"minute": 60.0, "day": 86400.0}
MERGE_WITHIN_S = 1.0  # uses this close are one entry


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
        if entries and now - entries[-1][0] < MERGE_WITHIN_S:
            entries[-1] = (max(now, entries[-1][0]), entries[-1][1] + tokens)
        else:
            entries.append((now, tokens))
        self._prune(entries, now)
        self._fold(entries, now)

    def __bool__(self) -> bool:
        return any(self._entries.values())

    def merge(self, other: "KeyLedger", now: float) -> None:
        """Another ledger's entries added to this one's (a process's uses not yet in the shared file)."""
        for key, theirs in other._entries.items():
            entries = deque(sorted([*self._entries.get(key, ()), *theirs]))
            self._prune(entries, now)
            self._fold(entries, now)
            self._entries[key] = entries
        for key in list(self._entries):  # keys unused for a day leave
            self._prune(self._entries[key], now)
            if not self._entries[key]:
                del self._entries[key]

    def only(self, key: str) -> "KeyLedger":
        """A copy holding this key's entries alone."""
        copy = KeyLedger()
        if key in self._entries:
            copy._entries[key] = deque(self._entries[key])
        return copy

    def to_doc(self) -> dict:
        return {"version": 1, "keys": {key: [[round(t, 3), n] for t, n in entries]
                                       for key, entries in self._entries.items() if entries}}

    @classmethod
    def from_doc(cls, doc: dict) -> "KeyLedger":
        """ValueError where the document is not one to_doc wrote."""
        if not isinstance(doc, dict) or doc.get("version") != 1 or not isinstance(doc.get("keys"), dict):
            raise ValueError("not a key ledger (version 1)")
        ledger = cls()
        for key, entries in doc["keys"].items():
            ledger._entries[str(key)] = deque(sorted((float(t), int(n)) for t, n in entries))
        return ledger

    def used(self, key: str, window: str, now: float) -> int:
        start = now - WINDOWS[window]
        return sum(tokens for t, tokens in self._entries.get(key, ()) if t > start)

    def refusal(self, key: str, per_minute: int, per_day: int, now: float,
                elsewhere: tuple[int, int] = (0, 0)) -> Refusal | None:
        """Why a new request of `key` must wait (the first limit reached), or None (0: no limit). `elsewhere`: what
        the key used in the last minute and day on the fleet's other boxes (their part is taken to stay: a wait
        they alone would hold is the whole window)."""
        entries = self._entries.setdefault(key, deque())
        self._prune(entries, now)
        for window, limit, other in (("minute", per_minute, elsewhere[0]), ("day", per_day, elsewhere[1])):
            if not limit:
                continue
            used = self.used(key, window, now) + other
            if used >= limit:
                return Refusal(window, used, limit, self._wait(entries, window, limit - other, now))
        return None

    def use_by_key(self, suffix: str, now: float) -> dict[str, list[int]]:
        """[minute, day] use of each key whose name ends with `suffix` (the fleet's vouched keys, KEY@fleet)."""
        return {key: [self.used(key, "minute", now), self.used(key, "day", now)]
                for key in self._entries if key.endswith(suffix) and self.used(key, "day", now)}

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

    @staticmethod
    def _fold(entries: deque, now: float) -> None:
        """Entries past the minute window, one a minute (the latest time of each), so the minute's count stays
        exact and a day holds at most 1,440."""
        old = []
        while entries and entries[0][0] <= now - WINDOWS["minute"]:
            old.append(entries.popleft())
        folded: list[tuple[float, int]] = []
        for t, tokens in old:
            if folded and int(folded[-1][0] // 60) == int(t // 60):
                folded[-1] = (t, folded[-1][1] + tokens)
            else:
                folded.append((t, tokens))
        entries.extendleft(reversed(folded))
