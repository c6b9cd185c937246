"""The fleet controller's decisions (pure): the boxes' capability maps in, the router's worker set out.

The router (sglang-router in IGW mode, host_runtime/fleet/router_process.py) balances among the workers it is
given and keeps its own prefix tree per worker; what it cannot know comes from here:
- a worker is one (box, model) pair, at the URL `BOX/fleet/MODEL` (the router keys workers by URL, and a box
  serves several models; the box's API strips the prefix, serving/app.py FleetPrefix);
- a box that does not answer twice running, or says it takes no new work (emergency, draining for an update),
  has no workers;
- a model loaded (or loading) on some boxes goes only to those, so that a request does not make another box
  load it; among those, boxes whose governor throttles are left out while an unthrottled one has it;
- a model only in stores (available) goes to the one box that loads it soonest, so that its first requests do
  not load it on several boxes at once: room beside what is loaded before room made by unloading idle models
  before room that busy ones hold (a box it can never fit is left out), then the shortest estimated load (its
  file's size over the fastest rate the box loaded its own models at, start to ready), then the box's name;
- among the boxes warm with a model, one whose measured speed (prompt tokens per second computing, from its map)
  is under SLOW_SHARE of the fastest's takes that model's requests only while every faster one is full (no free
  sequence, or a queue), and for SPILL_HOLD_S after (route_by_speed; the router's cache_aware balances by request
  counts and prefixes, blind to speed: with a 0.3-CPU box beside a 1-CPU one it sent the slow box 13 of the 32
  requests the two shared, bench/results-2026-12-04-fleet-hetero-2core.json)."""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import quote

from host_runtime.fleet.capabilities import Capabilities

WARM_STATES = ("loaded", "loading")
FAILURES_TO_REMOVE = 2  # a box missing this many polls in a row loses its workers (one slow answer is not down)
SLOW_SHARE = 0.5        # a box under half the fastest box's speed for a model spills over rather than shares
SPILL_HOLD_S = 5.0      # a slow box let in stays in this long once the faster ones have room (no flapping)
SPEED_MEMORY_S = 60.0   # a speed not measured again for this long is forgotten: the box is tried (and measured)
ROOM_ORDER = {"free": 0, None: 1, "unloads": 1, "waits": 2}  # a cold model's load: soonest first ("never": out)


@dataclass(frozen=True)
class Worker:
    """One (box, model) pair as the router knows it."""
    url: str
    model_id: str
    box: str  # the box's base URL

    @classmethod
    def of(cls, box: str, model_id: str) -> "Worker":
        return cls(f"{box.rstrip('/')}/fleet/{quote(model_id, safe='')}", model_id, box)


@dataclass(frozen=True)
class Report:
    """One poll of one box: its map, or why there is none."""
    box: str
    caps: Capabilities | None
    error: str = ""


@dataclass
class BoxHealth:
    """Consecutive failed polls per box (the controller's only memory)."""
    failures: dict[str, int] = field(default_factory=dict)

    def note(self, report: Report) -> bool:
        """Whether the box counts as answering after this report."""
        if report.caps is not None:
            self.failures[report.box] = 0
            return True
        self.failures[report.box] = self.failures.get(report.box, 0) + 1
        return self.failures[report.box] < FAILURES_TO_REMOVE


@dataclass
class Speeds:
    """Each (box, model)'s last measured speed, and until when a slow box is let in: the controller's memory of
    speed (a box that has had nothing to do lately has no fresh figure, and keeps its last one a while)."""
    measured: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict)  # -> (tokens/s, at)
    spill_until: dict[tuple[str, str], float] = field(default_factory=dict)

    def note(self, box: str, caps: Capabilities, now: float) -> None:
        for m in caps.models:
            if m.prefill_tokens_per_s:
                self.measured[(box, m.id)] = (m.prefill_tokens_per_s, now)

    def speed(self, box: str, model: str, now: float) -> float | None:
        found = self.measured.get((box, model))
        return found[0] if found is not None and now - found[1] <= SPEED_MEMORY_S else None

    def choose(self, model: str, boxes: list[str], usable: dict[str, Capabilities], now: float) -> list[str]:
        """Of the boxes warm with `model`, those its requests go to now: every box within SLOW_SHARE of the
        fastest (or not measured: it is tried), and the slower ones only while all of those are full."""
        known = {b: self.speed(b, model, now) for b in boxes}
        fastest = max((v for v in known.values() if v is not None), default=None)
        if fastest is None:
            return boxes
        fast = [b for b in boxes if (speed := known[b]) is None or speed >= SLOW_SHARE * fastest]
        slow = [b for b in boxes if b not in fast]
        if slow and all(_full(usable[b], model) for b in fast):
            for b in slow:
                self.spill_until[(b, model)] = now + SPILL_HOLD_S
        return fast + [b for b in slow if self.spill_until.get((b, model), 0.0) > now]


def load_rate(caps: Capabilities) -> float | None:
    """Bytes a second this box loaded its models at, start to ready (the fastest of its loaded models' loads: a
    small model's fixed costs make it look slower than the box is); None where it says none."""
    return max((m.size_bytes / m.load_s for m in caps.models
                if m.state == "loaded" and m.size_bytes and m.load_s), default=None)


def loads_soonest(model: str, boxes: list[str], usable: dict[str, Capabilities]) -> list[str]:
    """Of the boxes with `model` only in their stores, the one to load it on (all of them where it fits none:
    each answers its own 507 with the amounts)."""
    def row(box: str):
        return next(m for m in usable[box].models if m.id == model)

    def seconds(box: str) -> float:
        rate, size = load_rate(usable[box]), row(box).size_bytes
        return size / rate if rate and size else float("inf")

    fits = [b for b in boxes if row(b).room != "never"]
    if not fits:
        return boxes
    return [min(fits, key=lambda b: (ROOM_ORDER.get(row(b).room, 1), seconds(b), b))]


def _full(caps: Capabilities, model: str) -> bool:
    """Whether the box runs as many of the model's sequences as it may, or has some waiting."""
    m = next((m for m in caps.models if m.id == model), None)
    return m is not None and (m.slots_free == 0 or (m.queue_depth or 0) > 0)


@dataclass(frozen=True)
class Decision:
    workers: dict[str, Worker]                 # url -> worker
    left_out: dict[str, str]                   # box -> why it has no workers (absent: it has some or no models)


def vouches(settings, reports: list["Report"]) -> bool:
    """Whether the router's workers go without the fleet key, the front's voucher for the client's key in its
    place (auth/fleet_vouch.py): where fleet.toml says this gateway vouches and every box that answered checks
    vouchers. All or none: the router sends the client's header and adds a worker's key beside it, and a box's
    front refuses a request with two (400, measured)."""
    answered = [r.caps for r in reports if r.caps is not None]
    return settings.vouch_for_clients and bool(answered) and all(c.checks_vouchers for c in answered)


def vouching_reason(settings, reports: list["Report"]) -> str:
    """Why vouches() is False, for the log."""
    if not settings.vouch_for_clients:
        return "fleet.toml's vouch_for_clients is off (a gateway provisioned before vouchers: re-apply its bundle)"
    older = [r.box for r in reports if r.caps is not None and not r.caps.checks_vouchers]
    if older:
        return (f"{', '.join(older)} cannot check them (provisioned before vouchers, or an older version): "
                "re-apply their bundles; until then a key's limits hold only at the gateway's key check")
    return "no box answered"


def merge_peers(configured: tuple[str, ...], found: tuple[str, ...]) -> tuple[str, ...]:
    """The boxes to poll: fleet.toml's, then those found on the LAN that it does not already name."""
    known = {p.rstrip("/") for p in configured}
    return tuple(configured) + tuple(p for p in found if p.rstrip("/") not in known)


def _throttled(caps: Capabilities) -> bool:
    return caps.governor.state == "throttled"


def decide(reports: list[Report], health: BoxHealth, last: Decision | None = None, speeds: Speeds | None = None,
           now: float = 0.0) -> Decision:
    """The worker set for these reports. A box that failed once keeps the workers it had (`last`). speeds: the
    controller's memory of each box's speed, where it routes by speed (None: it does not)."""
    left_out: dict[str, str] = {}
    usable: dict[str, Capabilities] = {}
    kept: dict[str, Worker] = {}
    for report in reports:
        answering = health.note(report)
        if report.caps is None:
            if answering and last is not None:
                kept.update({u: w for u, w in last.workers.items() if w.box == report.box})
            else:
                left_out[report.box] = f"not answering: {report.error}"
            continue
        accepts, why = report.caps.accepts_new_work()
        if not accepts:
            left_out[report.box] = why
            continue
        usable[report.box] = report.caps
        if speeds is not None:
            speeds.note(report.box, report.caps, now)

    holders: dict[str, dict[str, list[str]]] = {}  # model -> {"warm": [box], "cold": [box]}
    for box, caps in usable.items():
        for m in caps.models:
            if caps.routable(m.id):
                holders.setdefault(m.id, {"warm": [], "cold": []})["warm" if m.state in WARM_STATES else "cold"].append(box)

    workers: dict[str, Worker] = dict(kept)
    for model_id, where in holders.items():
        boxes = where["warm"] or where["cold"]
        cool = [b for b in boxes if not _throttled(usable[b])] or boxes
        if not where["warm"]:
            cool = loads_soonest(model_id, cool, usable)
        elif speeds is not None:
            cool = speeds.choose(model_id, cool, usable, now)
        for box in cool:
            w = Worker.of(box, model_id)
            workers[w.url] = w
    return Decision(workers, left_out)


@dataclass(frozen=True)
class Registered:
    """A worker as the router lists it."""
    id: str
    url: str
    model_id: str


def changes(decision: Decision, registered: list[Registered]) -> tuple[list[Worker], list[Registered]]:
    """(workers to add, registrations to remove) to make the router's set the decision's."""
    have = {r.url: r for r in registered}
    remove = [r for r in registered
              if r.url not in decision.workers or decision.workers[r.url].model_id != r.model_id]
    removed = {r.url for r in remove}
    add = [w for url, w in sorted(decision.workers.items()) if url not in have or url in removed]
    return add, remove
