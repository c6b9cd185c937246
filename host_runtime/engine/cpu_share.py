"""How many threads an engine's llama.cpp calls use on the CPU: as many as it was given while it gets the cores,
fewer while something else holds them. Pure: the runner times each call and applies the answer.

llama.cpp's CPU workers wait for each other at every step of a call, spinning (ggml's barriers, OpenMP's
workers). With more threads than free cores, a thread that loses its core stalls the whole call while the others
spin. On 2 cores with the default model: two engines of 2 threads each decoding at once ran 16-24 tok/s each
(1.4 with some OpenMP spin counts), and 1 thread each 67-69 (one alone: 88.6 with 2 threads, 75 with 1); with a
busy loop on one core, 2 threads ran 36 tok/s and 1 thread 70-77. The calls' thread count does not change
llama.cpp's results (logits bit-identical at 1 and 2 threads), so it can change between calls.

The signal needs no view of other processes: a call of wall time W with n threads that all had cores takes n x W
of CPU time (measured 0.96-1.00 of it, in the server too), a contended one much less (0.50-0.75). It is judged over
a window of calls, as their CPU time over their wall time, never call by call: the kernel credits a thread running
on another core with its CPU time at its scheduler ticks, so a call shorter than a tick, while the other thread
spins through it, reads as half its cores or as much more (a 150M model's 4 ms calls: the median call 0.52, the
engine alone, and it went to 1 thread for a whole c=1 benchmark at 0.80x llama-server's tok/s). Below CONTENDED,
one thread fewer; now and then one more is tried again (a probe), kept only where it gets its cores or makes
the calls faster, so a neighbour that goes away gives the threads back; once a probe has shown a count gets its cores, only a share below
SETTLED takes it down again. Probes that fail are spaced further apart, up to PROBE_MAX_S.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

CONTENDED = 0.85  # the share of n x W (a window's) below which the threads did not get their cores, and a probe fails
SETTLED = 0.75    # the same bound once a probe has shown this count gets its cores: one stream alone in the server
                  # at 2 threads burns a median 0.96 (p10 0.80: its own HTTP worker takes a little), and at 0.85
                  # alone windows under it sent it to 1 thread (81-86 tok/s against 99-102); at 0.75 from the
                  # start, a busy loop's windows (0.63-0.75) often stayed above it (0.21-0.39 of alone)
WINDOW = 8        # calls judged together (their CPU time over their wall time)
WINDOW_S = 0.25   # or fewer (two at least), once their time adds up to this: a contended call took up to 0.7 s
WINDOW_MIN_S = 0.1  # and never less time than this: tens of scheduler ticks (1-10 ms each), whose credit evens out
MIN_CALL_S = 0.002  # calls shorter than this are not counted: timer noise
PROBE_FAILS_AT = 0.6  # one probe call this far below its cores fails the probe at once where it collapsed (at
COLLAPSED_S = 0.05    # least this long and PROBE_COLLAPSE times the calls before the probe): contended calls at
PROBE_COLLAPSE = 4.0  # too many threads collapse (one took 0.7 s against 15 ms), and two engines probing together
                      # held 2 threads each for 7 s before a window was judged; a short call's share is a tick's
PROBE_FASTER = 0.9   # a probe whose calls took at most this much of the calls' before it is kept whatever its share:
                      # an engine alone on this VM read 0.70-0.83 of 2 cores over whole windows at times, and its calls
                      # on 2 threads were still faster than on 1 (3.3 against 4.5-5.2 ms, 150M model)
FIRST_CALLS_S = 2.0   # an engine's first calls are not judged: its warm-up and canary read under 0.85 of 2 cores
                      # each start (first touches of its buffers), and it then served a c=1 benchmark's first 3 s on
                      # one thread
PROBE_FIRST_S = 2.0
PROBE_MAX_S = 64.0
PROBE_JITTER = 0.25   # each wait drawn within +-25%: two engines that stepped down together do not probe together


@dataclass
class ThreadShare:
    """Feed it each call's wall and CPU seconds (`observe`); it answers with a new thread count when there is one."""
    most: int                       # the threads this engine was given
    threads: int = 0                # the count in use
    _calls: int = 0                 # the window's calls, their CPU and wall seconds
    _cpu_s: float = 0.0
    _window_s: float = 0.0
    _wall_before_probe: float = 0.0  # the mean call of the last window judged before a probe
    _judge_from: float | None = None  # the first calls' time (set by the first call)
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
        if self._judge_from is None:
            self._judge_from = now + FIRST_CALLS_S
        if wall_s < MIN_CALL_S or now < self._judge_from:
            return None
        if (self._probing and cpu_s < PROBE_FAILS_AT * wall_s * self.threads
                and wall_s >= max(COLLAPSED_S, PROBE_COLLAPSE * self._wall_before_probe)):
            return self._probe_failed(now)
        self._calls += 1
        self._cpu_s += cpu_s
        self._window_s += wall_s
        if self._calls < 2 or self._window_s < WINDOW_MIN_S or (self._calls < WINDOW and self._window_s < WINDOW_S):
            return None
        share = self._cpu_s / (self._window_s * self.threads)
        mean_call_s = self._window_s / self._calls
        if not self._probing:
            self._wall_before_probe = mean_call_s
        self._clear()
        if self._probing:
            self._probing = False
            # the extra thread got a core, or made the calls faster all the same: keep it, try the next one soon
            if share >= CONTENDED or mean_call_s <= PROBE_FASTER * self._wall_before_probe:
                self._probe_wait_s = PROBE_FIRST_S
                self._next_probe_at = now + self._wait()
                self._settled = True
                return None
            return self._probe_failed(now)
        if share < (SETTLED if self._settled else CONTENDED) and self.threads > 1:
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
        self._clear()
        return threads

    def _clear(self) -> None:
        self._calls, self._cpu_s, self._window_s = 0, 0.0, 0.0
