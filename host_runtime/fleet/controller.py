"""The fleet controller's decisions (pure): the boxes' capability maps in, the router's worker set out.

The router (sglang-router in IGW mode, host_runtime/fleet/router_process.py) balances among the workers it is
given and keeps its own prefix tree per worker; what it cannot know comes from here:
- a worker is one (box, model) pair, at the URL `BOX/fleet/MODEL` (the router keys workers by URL, and a box
  serves several models; the box's API strips the prefix, serving/app.py FleetPrefix);
- a box that does not answer twice running, or says it takes no new work (emergency, draining for an update),
  has no workers;
- a model loaded (or loading) on some boxes goes only to those, so that a request does not make another box
  load it; among those, boxes whose governor throttles are left out while an unthrottled one has it;
- a model only in stores (available) goes to every box that has it: the first request loads it there."""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import quote

from host_runtime.fleet.capabilities import Capabilities

WARM_STATES = ("loaded", "loading")
FAILURES_TO_REMOVE = 2  # a box missing this many polls in a row loses its workers (one slow answer is not down)


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


def decide(reports: list[Report], health: BoxHealth, last: Decision | None = None) -> Decision:
    """The worker set for these reports. A box that failed once keeps the workers it had (`last`)."""
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

    holders: dict[str, dict[str, list[str]]] = {}  # model -> {"warm": [box], "cold": [box]}
    for box, caps in usable.items():
        for m in caps.models:
            if caps.routable(m.id):
                holders.setdefault(m.id, {"warm": [], "cold": []})["warm" if m.state in WARM_STATES else "cold"].append(box)

    workers: dict[str, Worker] = dict(kept)
    for model_id, where in holders.items():
        boxes = where["warm"] or where["cold"]
        cool = [b for b in boxes if not _throttled(usable[b])]
        for box in cool or boxes:
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
