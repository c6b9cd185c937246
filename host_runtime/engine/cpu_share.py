"""How many threads an engine's llama.cpp calls use on the CPU: the count that decodes fastest now, found by
trying. Pure: the runner times each call and applies the answer.

llama.cpp's CPU workers wait for each other at every step of a call, spinning (ggml's barriers, OpenMP's
workers). With more threads than free cores, a thread that loses its core stalls the whole call while the others
spin. On 2 cores with the default model: two engines of 2 threads each decoding at once ran 16-24 tok/s each
(1.4 with some OpenMP spin counts), and 1 thread each 67-69 (one alone: 88.6 with 2 threads, 75 with 1); with a
busy loop on one core, 2 threads ran 36 tok/s and 1 thread 70-77. The calls' thread count does not change
llama.cpp's results (logits bit-identical at 1 and 2 threads), so it can change between calls.

A call of wall time W with n threads that all had cores takes n x W of CPU time (measured median 0.99-1.00), a
contended one much less (0.50-0.75): below CONTENDED a trial of one thread fewer starts. That signal alone is not
enough: the server's own HTTP worker takes a little of a 2-core box, and one stream alone ran 99-102 tok/s with 2
threads against 81-86 when the share sent it to 1. So a trial is kept only where its calls are faster per token
than the window before it at the old count (calls of the same size compared); every so often one thread more is
tried the same way. A trial that fails waits twice as long before the next in that direction (up to TRY_MAX_S).
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

CONTENDED = 0.85    # the median share of n x W below which one thread fewer is tried
KEEP_IF = 0.95      # a trial is kept where its time per token is under this share of the old count's
COLLAPSED = 3.0     # a trial call this many times slower per token than before fails the trial at once: calls at
                    # too many threads collapse (one took 0.7 s against 15 ms)
WINDOW = 8          # calls judged together (their median)
WINDOW_S = 0.25     # or fewer (two at least), once their time adds up to this
STRAYS = 4 * WINDOW  # calls of another size during a trial that end it undecided (a trial begun on a warm-up's
                     # prompt calls waited for ever while one-token calls came, and stayed at 1 thread)
MIN_CALL_S = 0.002  # calls shorter than this are not judged: timer noise
TRY_FIRST_S = 2.0
TRY_MAX_S = 64.0
JITTER = 0.25       # each wait drawn within +-25%: two engines that stepped down together do not try together


def size_class(tokens: int) -> int:
    """Calls compared with each other: one token, a few sequences' tokens, a batch, prompt chunks."""
    return 0 if tokens <= 1 else 1 if tokens <= 8 else 2 if tokens <= 64 else 3


@dataclass
class ThreadShare:
    """Feed it each call (`observe`); it answers with a new thread count when there is one."""
    most: int                       # the threads this engine was given
    threads: int = 0                # the count in use
    rng: Callable[[], float] = random.random  # for the jitter (a test gives a constant)
    _calls: list[tuple[float, float]] = field(default_factory=list)  # (seconds per token, share) this window
    _window_s: float = 0.0
    _size: int | None = None        # the size class this window judges
    _strays: int = 0                # calls of another size seen during a trial
    _trial: tuple[int, float] | None = None  # (the count before the trial, its seconds per token)
    _wait_s: dict[int, float] = field(default_factory=lambda: {-1: TRY_FIRST_S, 1: TRY_FIRST_S})
    _next_at: dict[int, float] = field(default_factory=lambda: {-1: 0.0, 1: TRY_FIRST_S})

    def __post_init__(self) -> None:
        self.most = max(1, self.most)
        self.threads = self.threads or self.most

    def observe(self, wall_s: float, cpu_s: float, tokens: int, now: float) -> int | None:
        """One call: its wall time, the process's CPU time over it, its tokens, at `now` (monotonic seconds).
        Returns the thread count for the next calls where it changes, else None."""
        if wall_s < MIN_CALL_S or tokens < 1:
            return None
        size = size_class(tokens)
        if self._size is None:
            self._size = size
        if size != self._size:
            if self._trial is None:  # the traffic changed: judge the calls coming now
                self._clear()
                self._size = size
            else:  # not comparable with what the trial is measured against
                self._strays += 1
                if self._strays >= STRAYS:  # those calls do not come any more: back, and try again later
                    return self._end_trial(now, kept=None)
                return None
        per_token = wall_s / tokens
        if self._trial is not None and per_token > COLLAPSED * self._trial[1]:
            return self._end_trial(now, kept=False)
        self._calls.append((per_token, cpu_s / (wall_s * self.threads)))
        self._window_s += wall_s
        if len(self._calls) < WINDOW and (len(self._calls) < 2 or self._window_s < WINDOW_S):
            return None
        per_token = statistics.median(c[0] for c in self._calls)
        share = statistics.median(c[1] for c in self._calls)
        self._clear()
        if self._trial is not None:
            return self._end_trial(now, kept=per_token < KEEP_IF * self._trial[1])
        if share < CONTENDED and self.threads > 1 and now >= self._next_at[-1]:
            return self._start_trial(-1, per_token, size)
        if self.threads < self.most and now >= self._next_at[1]:
            return self._start_trial(1, per_token, size)
        return None

    def _start_trial(self, step: int, per_token: float, size: int) -> int:
        self._trial = (self.threads, per_token)
        self.threads += step
        self._size = size  # the trial is judged on calls like the window it is compared with
        return self.threads

    def _end_trial(self, now: float, kept: bool | None) -> int | None:
        """kept None: undecided (no comparable calls came): back to the old count, the wait as it was."""
        before, _ = self._trial
        step = 1 if self.threads > before else -1
        self._trial = None
        self._clear()
        if kept is None:
            self._next_at[step] = now + self._wait(step)
            self.threads = before
            return before
        if kept:
            self._wait_s[step] = TRY_FIRST_S
            self._next_at[step] = now + self._wait(step)
            self._next_at[-step] = now + self._wait(-step)  # settle before trying back
            return None
        self._wait_s[step] = min(TRY_MAX_S, self._wait_s[step] * 2)
        self._next_at[step] = now + self._wait(step)
        self.threads = before
        return before

    def _clear(self) -> None:
        self._calls.clear()
        self._window_s, self._size, self._strays = 0.0, None, 0

    def _wait(self, step: int) -> float:
        return self._wait_s[step] * (1 + JITTER * (2 * self.rng() - 1))

    @property
    def trying(self) -> bool:
        return self._trial is not None
