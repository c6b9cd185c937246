"""A fleet's rolling update (pure): which box to update next, whether to wait, when to stop.

One box at a time. A box updates on its own (update/service.py: it drains as the update is copied and written,
reboots into the new slot, and its health gate blesses the slot or the boot loader rolls it back); the rollout
only starts each in turn and reads the outcome from the box's capability map (version, draining, the update
record's phase). It never starts a box while another holder of one of its models is down or draining, so a model
that N boxes hold always has N-1 serving it; and it stops at the first box that does not come back on the target
version, saying which and why, leaving the rest as they are.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from host_runtime.fleet.capabilities import Capabilities

START, WAIT, HOLD, DONE, STOPPED = "start", "wait", "hold", "done", "stopped"
OUTCOMES_THAT_FAIL = ("rolled-back", "refused", "failed", "interrupted")


@dataclass(frozen=True)
class BoxView:
    """One box as the rollout sees it: its URL and its last capability map (None: it does not answer)."""

    box: str
    caps: Capabilities | None

    @property
    def serving(self) -> bool:
        return self.caps is not None and self.caps.accepts_new_work()[0]


@dataclass(frozen=True)
class Step:
    action: str          # start, wait, hold, done, stopped
    box: str = ""
    why: str = ""


@dataclass
class Rollout:
    """The rollout's memory: the target, the order, the box being updated and since when, the boxes done."""

    target: str
    order: tuple[str, ...]
    timeout_s: float = 1800.0        # from start to back on the target: copy, write, reboot, health gate
    current: str = ""
    started_at: float = 0.0
    record_at_start: tuple[str, str, str] = ("", "", "")  # the box's update record then: an earlier outcome
    done: list[str] = field(default_factory=list)
    known_models: dict[str, tuple[str, ...]] = field(default_factory=dict)  # each box's, from its last answer

    def next_step(self, views: list[BoxView], now: float) -> Step:
        by_box = {v.box: v for v in views}
        for v in views:
            if v.caps is not None:
                self.known_models[v.box] = tuple(m.id for m in v.caps.models)
        if self.current:
            step = self._follow(by_box.get(self.current), now)
            if step.action != DONE:
                return step
            self.done.append(self.current)
            self.current = ""
        for box in self.order:
            view = by_box.get(box)
            if box in self.done:
                continue
            if view is not None and view.caps is not None and view.caps.version == self.target:
                self.done.append(box)  # already there
                continue
            if view is None or view.caps is None:
                return Step(HOLD, box, "it does not answer: the rollout waits for it rather than skip it")
            blocked = self._would_leave_short(view, views)
            if blocked:
                return Step(HOLD, box, blocked)
            return Step(START, box, f"{view.caps.version} -> {self.target}")
        return Step(DONE, why=f"every box runs {self.target}")

    def started(self, box: str, views: list[BoxView], now: float) -> None:
        """The box was asked to update (its update service took the request)."""
        caps = next(v for v in views if v.box == box).caps
        self.current, self.started_at = box, now
        self.record_at_start = (caps.update_target, caps.update_phase, caps.update_reason) if caps else ("", "", "")

    def _follow(self, view: BoxView | None, now: float) -> Step:
        waited = now - self.started_at
        caps = view.caps if view is not None else None
        record = (caps.update_target, caps.update_phase, caps.update_reason) if caps is not None else None
        if (record is not None and record != self.record_at_start and caps.update_target == self.target
                and caps.update_phase in OUTCOMES_THAT_FAIL):
            return Step(STOPPED, self.current, f"its update to {self.target} {caps.update_phase}"
                        + (f": {caps.update_reason}" if caps.update_reason else ""))
        if caps is not None and caps.version == self.target and caps.update_phase == "blessed" and not caps.draining:
            return Step(DONE, self.current)
        if waited > self.timeout_s:
            seen = ("not answering" if caps is None else
                    f"on {caps.version}, update {caps.update_phase or 'not started'}")
            return Step(STOPPED, self.current, f"not back on {self.target} after {self.timeout_s:.0f} s ({seen})")
        if caps is None:
            return Step(WAIT, self.current, "rebooting (not answering)")
        return Step(WAIT, self.current, f"update {caps.update_phase or 'requested'}"
                    + (f" ({caps.draining_reason})" if caps.draining else ""))

    def _would_leave_short(self, candidate: BoxView, views: list[BoxView]) -> str:
        """Why updating this box now would leave one of its models with fewer than N-1 boxes serving it."""
        serving = {v.box for v in views if v.serving}
        for model in sorted(m.id for m in candidate.caps.models):
            others = [box for box, models in self.known_models.items() if box != candidate.box and model in models]
            down = [box for box in others if box not in serving]
            if down:
                return (f"{model} is held by {len(others) + 1} boxes and {', '.join(down)} "
                        f"{'is' if len(down) == 1 else 'are'} not serving it: updating this one now would leave "
                        f"{len(others) - len(down)}")
        return ""
