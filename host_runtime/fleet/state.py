"""What the fleet gateway sees and did, each poll (pure): the state file `everycycle fleet gateway --state` writes
and `everycycle fleet status` reads, through these types, so that both sides agree on every field."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from host_runtime.auth.fleet_vouch import VOUCHED_SUFFIX
from host_runtime.fleet.capabilities import ROUTABLE_STATES, known_fields
from host_runtime.fleet.controller import Registered, Worker


@dataclass(frozen=True)
class BoxState:
    box: str                        # the box's API base URL, as fleet.toml (or mDNS) names it
    answering: bool
    error: str = ""                 # why it does not answer
    left_out: str = ""              # why it gets no new work although it answers (emergency, draining)
    name: str = ""                  # its host name, from its capability map
    version: str = ""               # the system release it runs
    slot: str = ""                  # the A/B slot it booted from
    draining: bool = False
    models: tuple[str, ...] = ()    # the models it holds loaded or in its store
    speeds: dict = field(default_factory=dict)  # model -> its prompt tokens/s computing, where measured lately
    shards: dict = field(default_factory=dict)  # model -> the boxes lending it devices: [[host, round trip ms, MB/s]]

    def summary(self) -> str:
        """One word or phrase for a person: serving, draining (why), left out (why), not answering (why)."""
        if not self.answering:
            return f"not answering ({self.error})" if self.error else "not answering"
        if self.left_out:
            return f"left out: {self.left_out}"
        return "serving"


@dataclass(frozen=True)
class GatewayState:
    at_unix: float
    policy: str
    boxes: tuple[BoxState, ...] = ()
    workers: tuple[Worker, ...] = ()         # what the controller decided
    registered: tuple[Registered, ...] = ()  # what the router lists
    # {client key: {box's use id: [minute, day]}}: the tokens each vouched key used on each box, as polled; the
    # gateway's API puts a key's row in its vouchers (auth/fleet_vouch.py)
    vouched_use: dict = field(default_factory=dict)
    vouching: bool = False  # the router's workers go without the fleet key: the API gives the front vouchers

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: dict) -> "GatewayState":
        def only(kind, row: dict):
            return kind(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in known_fields(kind, row).items()})

        return cls(at_unix=float(doc.get("at_unix", 0.0)), policy=str(doc.get("policy", "")),
                   boxes=tuple(only(BoxState, b) for b in doc.get("boxes", [])),
                   workers=tuple(only(Worker, w) for w in doc.get("workers", [])),
                   registered=tuple(only(Registered, r) for r in doc.get("registered", [])),
                   vouched_use=dict(doc.get("vouched_use") or {}), vouching=doc.get("vouching") is True)


def vouched_use(reports) -> dict:
    """The polled boxes' vouched use, by client key (KEY@fleet -> KEY), then by box."""
    out: dict[str, dict[str, list[int]]] = {}
    for r in reports:
        caps = r.caps
        if caps is None or not caps.use_id:
            continue
        for key, use in caps.vouched_use.items():
            if key.endswith(VOUCHED_SUFFIX) and isinstance(use, list) and len(use) == 2:
                out.setdefault(key[:-len(VOUCHED_SUFFIX)], {})[caps.use_id] = [int(use[0]), int(use[1])]
    return out


def box_state(report, left_out: str) -> BoxState:
    """A poll's report (controller.Report) as the state file's row."""
    caps = report.caps
    if caps is None:
        return BoxState(report.box, False, error=report.error)
    return BoxState(report.box, True, left_out=left_out, name=caps.box, version=caps.version, slot=caps.slot,
                    draining=caps.draining, models=tuple(m.id for m in caps.models if m.state in ROUTABLE_STATES),
                    speeds={m.id: m.prefill_tokens_per_s for m in caps.models if m.prefill_tokens_per_s},
                    shards={m.id: [[s.get("host"), s.get("round_trip_ms"), s.get("mbytes_per_s")] for s in m.shard_hosts]
                            for m in caps.models if m.shard_hosts})


def render(state: GatewayState, now: float) -> list[str]:
    """`everycycle fleet status`: a line per box (name, version, slot, state, models)."""
    lines = [f"fleet gateway ({state.policy}), polled {max(0.0, now - state.at_unix):.0f} s ago: "
             f"{sum(b.answering and not b.left_out for b in state.boxes)} of {len(state.boxes)} boxes serving, "
             f"{len(state.registered)} workers in the router"]
    for b in state.boxes:
        lines.append(f"  {b.box}  {b.name or '?'}  {_short(b.version)}  slot {_short(b.slot)}  {b.summary()}"
                     + (f"  models: {', '.join(b.models)}" if b.models else "")
                     + (f"  prefill speed: {', '.join(f'{m} {v:.1f} tok/s' for m, v in sorted(b.speeds.items()))}"
                        if b.speeds else "")
                     + "".join(f"  {m} across {', '.join(f'{h} ({rtt:g} ms, {mbps:g} MB/s)' for h, rtt, mbps in hosts)}"
                               for m, hosts in sorted(b.shards.items())))
    routed: dict[str, list[str]] = {}
    for w in state.workers:
        routed.setdefault(w.model_id, []).append(w.box)
    for model, boxes in sorted(routed.items()):
        lines.append(f"  {model} -> {', '.join(sorted(boxes))}")
    return lines


def _short(value: str) -> str:
    """A reading the box could not make says only so here (`--json` keeps its reason)."""
    return "unavailable" if value.startswith("unavailable") else value or "?"
