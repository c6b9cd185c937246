"""How many threads an engine's llama.cpp calls use on the CPU: as many as it was given while it gets the cores,
fewer while something else holds them. Pure: the runner times each call and applies the answer.

llama.cpp's CPU workers wait for each other at every step of a call, spinning (ggml's barriers, OpenMP's
workers). With more threads than free cores, a thread that loses its core stalls the whole call while the others
spin. On 2 cores with the default model: two engines of 2 threads each decoding at once ran 16-24 tok/s each
(1.4 with some OpenMP spin counts), and 1 thread each 67-69 (one alone: 88.6 with 2 threads, 75 with 1); with a
busy loop on one core, 2 threads ran 36 tok/s and 1 thread 70-77. The calls' thread count does not change
llama.cpp's results (logits bit-identical at 1 and 2 threads), so it can change between calls.

The signal needs no view of other processes: a call of wall time W with n threads that all had cores takes n x W
of CPU time (measured median 0.96-1.00 of it, in the server too), a contended one much less (0.50-0.75). Below
CONTENDED, one thread fewer; now and then one more is tried again (a probe), kept only where it gets its cores, so
a neighbour that goes away gives the threads back; once a probe has shown a count gets its cores, only a share below
SETTLED takes it down again. Probes that fail are spaced further apart, up to PROBE_MAX_S.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

CONTENDED = 0.85  # the median share of n x W below which the threads did not get their cores, and a probe fails
SETTLED = 0.75    # the same bound once a probe has shown this count gets its cores: one stream alone in the server
                  # at 2 threads burns a median 0.96 (p10 0.80: its own HTTP worker takes a little), and at 0.85
                  # alone windows under it sent it to 1 thread (81-86 tok/s against 99-102); at 0.75 from the
                  # start, a busy loop's windows (0.63-0.75) often stayed above it (0.21-0.39 of alone)
WINDOW = 8        # calls judged together (their median)
WINDOW_S = 0.25   # or fewer (two at least), once their time adds up to this: a contended call took up to 0.7 s
MIN_CALL_S = 0.002  # calls shorter than this are not judged: timer noise
PROBE_FAILS_AT = 0.6  # one probe call this far below its cores fails the probe at once: contended calls at too
                      # many threads collapse (one took 0.7 s against 15 ms), and two engines probing together
                      # held 2 threads each for 7 s before a window was judged
PROBE_FIRST_S = 2.0
PROBE_MAX_S = 64.0
PROBE_JITTER = 0.25   # each wait drawn within +-25%: two engines that stepped down together do not probe together


@dataclass
class ThreadShare:
    """Feed it each call's wall and CPU seconds (`observe`); it answers with a new thread count when there is one."""
    most: int                       # the threads this engine was given
    threads: int = 0                # the count in use
    _shares: list[float] = field(default_factory=list)
    _window_s: float = 0.0
    _probing: bool = False
    _probe_wait_s: float = PROBE_FIRST_S
    _next_probe_at: float = 0.0
    _settled: bool = False          # a probe showed this count gets its cores: SETTLED is the bound, not CONTENDED
    rng: Callable[[], float] = random.random  # for the jitter (a test gives a constant)

    def __post_init__(self) -> None:
        self.most = max(1, self.most)
        self.threads = self.threads or self.most

    def observe(self, wall_s: float, cpu_s: float, now: float) -> int | None:
        """One call's wall time and the process's CPU time over it, at `now` (monotonic seconds). Returns the
        thread count for the next calls where it changes, else None."""
        if self.threads < self.most and not self._probing and now >= self._next_probe_at:
            return self._change(self.threads + 1, probing=True)
        if wall_s < MIN_CALL_S:
            return None
        share = cpu_s / (wall_s * self.threads)
        if self._probing and share < PROBE_FAILS_AT:
            return self._probe_failed(now)
        self._shares.append(share)
        self._window_s += wall_s
        if len(self._shares) < WINDOW and (len(self._shares) < 2 or self._window_s < WINDOW_S):
            return None
        median = statistics.median(self._shares)
        self._shares.clear()
        self._window_s = 0.0
        if self._probing:
            self._probing = False
            if median >= CONTENDED:  # the extra thread got a core: keep it, and try the next one soon
                self._probe_wait_s = PROBE_FIRST_S
                self._next_probe_at = now + self._wait()
                self._settled = True
                return None
            return self._probe_failed(now)
        if median < (SETTLED if self._settled else CONTENDED) and self.threads > 1:
            self._next_probe_at = now + self._wait()
            return self._change(self.threads - 1)
        return None

    def _probe_failed(self, now: float) -> int:
        self._probing = False
        self._probe_wait_s = min(PROBE_MAX_S, self._probe_wait_s * 2)
        self._next_probe_at = now + self._wait()
        return self._change(self.threads - 1)

    def _wait(self) -> float:
        return self._probe_wait_s * (1 + PROBE_JITTER * (2 * self.rng() - 1))

    def _change(self, threads: int, probing: bool = False) -> int:
        self.threads, self._probing, self._settled = threads, probing, False
        self._shares.clear()
        self._window_s = 0.0
        return threads
