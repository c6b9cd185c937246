"""The readiness verdict (pure): loading, starting, ready, busy but progressing, unhealthy, or wedged.

Slow is not wedged. A box decoding at 0.1 token/s is ready as long as its decode calls keep completing; it is
wedged only when no call has completed, while work was pending, for longer than a bound derived from its own
measured call times (a multiple of the slowest recent call, scaled to the size of the call in flight, with a
floor). The canary generation proves the model answers; one runs at a time and its result is shared.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

from host_runtime.engine.progress import ProgressSnapshot

# HTTP status per state: 200 for a box that serves (even slowly), 503 for one that does not yet or cannot.
READY_STATES = frozenset({"ready", "busy"})
STATES = ("loading", "failed", "starting", "ready", "busy", "unhealthy", "wedged", "unreachable")


@dataclass(frozen=True)
class WedgePolicy:
    floor_s: float = 30.0   # never wedged sooner: a GC pause, a page-in of cold weights, a busy disk
    multiple: float = 10.0  # times the expected length of the call in flight

    def bound_s(self, progress: ProgressSnapshot | None) -> float:
        """How long pending work may go without a completed decode call before the engine counts as wedged."""
        if progress is None:
            return self.floor_s
        expected = progress.slowest_call_s or 0.0
        if progress.in_call_tokens and progress.s_per_token:
            expected = max(expected, progress.in_call_tokens * progress.s_per_token)
        return max(self.floor_s, self.multiple * expected)


@dataclass(frozen=True)
class CanaryRecord:
    running_for_s: float | None = None  # the canary in flight, if any
    passed_ago_s: float | None = None   # since the last canary passed (None: none has since load)
    last_seconds: float | None = None   # how long the last one that finished took
    failure: str | None = None          # why the last one failed, if it did and none passed since
    count: int = 0                      # canaries started since load
    note: str | None = None             # why none could start now (the queue is full)


@dataclass(frozen=True)
class Verdict:
    ready: bool
    state: str
    reason: str
    step_s: float | None = None       # the last decode call's time
    slowest_step_s: float | None = None  # the slowest recent call's time
    bound_s: float | None = None      # the wedge bound now
    stalled_s: float | None = None
    canary_s: float | None = None     # the last finished canary's time: what a probe costs
    canaries: int = 0
    load_progress: float | None = None
    calls: int | None = None          # decode calls completed since load: a watcher's sign of progress

    def to_wire(self) -> dict:
        return asdict(self)

    @classmethod
    def from_wire(cls, doc: dict) -> "Verdict":
        return cls(**{k: doc.get(k) for k in cls.__dataclass_fields__ if k in doc})


def _secs(value: float) -> str:
    return f"{value:.2f} s" if value < 10 else f"{value:.0f} s"


def judge(load_state: str, load_reason: str, progress: ProgressSnapshot | None, canary: CanaryRecord,
          policy: WedgePolicy, load_progress: float | None = None) -> Verdict:
    if load_state != "ready":
        state = "failed" if load_state == "failed" else "loading"
        return Verdict(False, state, load_reason, load_progress=load_progress)
    bound = policy.bound_s(progress)
    stalled = progress.stalled_s() if progress else 0.0
    figures = dict(step_s=progress.last_call_s if progress else None,
                   slowest_step_s=progress.slowest_call_s if progress else None, bound_s=round(bound, 3),
                   stalled_s=round(stalled, 3), canary_s=canary.last_seconds, canaries=canary.count,
                   calls=progress.calls if progress else None)
    if stalled > bound:
        slowest = progress.slowest_call_s or 0.0
        return Verdict(False, "wedged", f"wedged: no decode completed for {_secs(stalled)} while work was pending "
                       f"(bound {_secs(bound)}: {policy.multiple:g}x the expected call, slowest recent "
                       f"{_secs(slowest)}, floor {_secs(policy.floor_s)})", **figures)
    step = f"last step {_secs(progress.last_call_s)}" if progress and progress.last_call_s is not None else "no step yet"
    if canary.failure is not None and canary.running_for_s is None:
        return Verdict(False, "unhealthy", f"the canary generation failed: {canary.failure}", **figures)
    if canary.passed_ago_s is None:
        doing = (f"the first canary has run {_secs(canary.running_for_s)}" if canary.running_for_s is not None
                 else canary.note or "no canary has run yet")
        return Verdict(False, "starting", f"starting: {doing}; the engine is progressing ({step})", **figures)
    if canary.running_for_s is not None:
        return Verdict(True, "busy", f"busy but progressing: a canary has run {_secs(canary.running_for_s)} "
                       f"({step}, wedged after {_secs(bound)} without one)", **figures)
    last = f" in {_secs(canary.last_seconds)}" if canary.last_seconds is not None else ""
    extra = f"; {canary.note}" if canary.note else ""
    return Verdict(True, "ready", f"ready: the canary passed {_secs(canary.passed_ago_s)} ago{last}{extra}", **figures)


def unanswered(last: Verdict | None, silent_for_s: float, policy: WedgePolicy, why: str = "") -> Verdict:
    """The verdict of a serving worker whose engine does not answer at all (stopped, or its socket gone):
    wedged once the engine has been silent past the bound it last reported, unreachable before that."""
    bound = last.bound_s if last is not None and last.bound_s else policy.floor_s
    if last is not None and last.state not in ("loading", "failed") and silent_for_s > bound:
        return Verdict(False, "wedged", f"wedged: the engine has not answered for {_secs(silent_for_s)} "
                       f"(bound {_secs(bound)})", bound_s=bound, stalled_s=round(silent_for_s, 3))
    return Verdict(False, "unreachable", f"the engine is not answering (for {_secs(silent_for_s)}){': ' + why if why else ''}",
                   bound_s=bound, stalled_s=round(silent_for_s, 3))


# What a watcher of /ready (the image's boot check, the update's health gate) tolerates without any sign of
# progress, and its absolute limit: a box that loads or decodes slowly keeps its time as long as it moves.
QUIET_LIMIT_S = 300.0
CAP_S = 3600.0


class ReadyDeadline:
    """Waiting for /ready with a deadline that follows the box's measured progress rather than a fixed wait.

    Each /ready body is a sign of progress when its state, load progress, decode calls or canaries differ from
    the last; the wait fails when there has been none for the larger of quiet_s and twice the engine's own wedge
    bound, when the engine says it is wedged or failed, or past cap_s in all."""

    def __init__(self, quiet_s: float = QUIET_LIMIT_S, cap_s: float = CAP_S, clock=None):
        self._clock = clock or time.monotonic
        self.quiet_s, self.cap_s = quiet_s, cap_s
        self.started = self.last_change = self._clock()
        self._marker: tuple | None = None
        self._bound = 0.0
        self.last: dict | None = None

    def observe(self, doc: dict | None) -> None:
        """One look: the /ready body as JSON (None when nothing answered)."""
        self.last = doc
        if not doc:
            return
        marker = (doc.get("state"), doc.get("load_progress"), doc.get("calls"), doc.get("canaries"))
        if marker != self._marker:
            self._marker, self.last_change = marker, self._clock()
        self._bound = float(doc.get("bound_s") or 0.0)

    def failed(self) -> str | None:
        """Why the wait is over without the box becoming ready, or None to keep waiting."""
        state = (self.last or {}).get("state")
        if state in ("wedged", "failed"):
            return f"the engine is {state}: {self.last.get('reason')}"
        now = self._clock()
        quiet = max(self.quiet_s, 2 * self._bound)
        if now - self.last_change > quiet:
            return (f"no sign of progress for {now - self.last_change:.0f} s (limit {quiet:.0f} s); last: "
                    f"{(self.last or {}).get('reason', 'no answer')}")
        if now - self.started > self.cap_s:
            return f"not ready within {self.cap_s:.0f} s; last: {(self.last or {}).get('reason', 'no answer')}"
        return None
