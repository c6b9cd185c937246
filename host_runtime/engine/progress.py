"""The engine's own progress: decode calls completed, their times, and whether work is waiting for one.

The loop thread writes it around every llama_decode; the readiness verdict reads a consistent snapshot from
another thread. "Wedged" is judged from these figures (no call completed for a bound derived from the
measured call times while work was pending), never from how long one request took.
"""

from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass

RECENT_CALLS = 64  # the window the bound is derived from
MULTI_TOKEN = 8  # calls with at least this many tokens give the per-token (prompt) rate


@dataclass(frozen=True)
class ProgressSnapshot:
    calls: int                   # decode calls completed since load (warm-up included)
    tokens: int                  # tokens those calls carried
    since_last_call_s: float | None   # since the last call completed (None: none yet)
    pending_for_s: float | None  # how long work has been waiting or running (None: the engine is idle)
    in_call_s: float | None      # how long the call in flight has run (None: none in flight)
    in_call_tokens: int          # tokens of the call in flight
    slowest_call_s: float | None  # the slowest of the recent calls
    last_call_s: float | None
    s_per_token: float | None    # the slowest per-token time of recent multi-token (prompt) calls, kept when none

    def stalled_s(self) -> float:
        """Seconds work has been pending without a decode call completing (0 when idle)."""
        if self.pending_for_s is None:
            return 0.0
        if self.since_last_call_s is None:
            return self.pending_for_s
        return min(self.pending_for_s, self.since_last_call_s)


class DecodeProgress:
    def __init__(self, clock=time.monotonic):
        self._clock = clock
        self._lock = threading.Lock()  # held for a few assignments; never taken in a signal handler
        self._calls = 0
        self._tokens = 0
        self._last_end: float | None = None
        self._call_start: float | None = None
        self._call_tokens = 0
        self._pending_since: float | None = None
        self._recent: collections.deque[tuple[float, int]] = collections.deque(maxlen=RECENT_CALLS)
        self._s_per_token: float | None = None

    def pending(self, has_work: bool) -> None:
        """The loop says whether requests wait or run; a stall is counted only while they do."""
        with self._lock:
            if not has_work:
                self._pending_since = None
            elif self._pending_since is None:
                self._pending_since = self._clock()

    def call_started(self, n_tokens: int) -> None:
        with self._lock:
            self._call_start, self._call_tokens = self._clock(), n_tokens

    def call_ended(self) -> float:
        """Record the call in flight as completed; its seconds."""
        with self._lock:
            now = self._clock()
            seconds = now - (self._call_start if self._call_start is not None else now)
            n = self._call_tokens
            self._calls += 1
            self._tokens += n
            self._last_end = now
            self._call_start = None
            self._recent.append((seconds, n))
            rates = [s / k for s, k in self._recent if k >= MULTI_TOKEN]
            if rates:
                self._s_per_token = max(rates)
            return seconds

    def snapshot(self) -> ProgressSnapshot:
        with self._lock:
            now = self._clock()
            recent = list(self._recent)
            return ProgressSnapshot(
                calls=self._calls, tokens=self._tokens,
                since_last_call_s=None if self._last_end is None else now - self._last_end,
                pending_for_s=None if self._pending_since is None else now - self._pending_since,
                in_call_s=None if self._call_start is None else now - self._call_start,
                in_call_tokens=self._call_tokens if self._call_start is not None else 0,
                slowest_call_s=max((s for s, _ in recent), default=None),
                last_call_s=recent[-1][0] if recent else None,
                s_per_token=self._s_per_token)
