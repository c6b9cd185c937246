"""A box's capability map (pure): what the fleet's gateway needs to know and only the box can say. The serving
API writes it (GET /v1/everycycle/capabilities) and the fleet's controller reads it, both through these types.

A box in emergency, or draining for an update, takes no new work; a model is routable to a box that has it
loaded, or in its store (it loads on demand)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

from host_runtime.update.record import INSTALLED, IN_APPLY

WIRE_OBJECT = "everycycle.capabilities"
ROUTABLE_STATES = ("loaded", "loading", "available")


@dataclass(frozen=True)
class ModelCapability:
    id: str
    state: str                          # loaded, loading, available, downloading, failed
    context_length: int | None = None
    pinned: bool = False
    placement: dict[str, int] = field(default_factory=dict)   # device -> layers it holds (loaded models)
    slots_total: int | None = None      # sequences the engine runs at once
    slots_free: int | None = None       # of those, free now (the governor's hint lowers the total)
    queue_depth: int | None = None      # requests waiting for a slot
    tokens_per_s: float | None = None   # generated over the last 30 s: what demand asked of it
    # prompt tokens computed per second of the calls that computed them, over the last 30 s: its speed, what the
    # controller routes by (None: not a second of prompt work lately)
    prefill_tokens_per_s: float | None = None
    ttft_p50_s: float | None = None     # median of the last 64 requests' time to first token
    prefix_cache_bytes: dict[str, int] = field(default_factory=dict)  # tier -> bytes held
    kv_bytes_per_token: int | None = None   # one token's K and V over all layers (the planner's figure)
    trained_context_length: int | None = None  # what it was trained for; context_length is what it is served at
    # Other boxes lending it devices (one model across boxes, host_runtime/shard): [{host, devices (here),
    # round_trip_ms, mbytes_per_s}], the link as measured when its engine joined them.
    shard_hosts: list = field(default_factory=list)
    # What loading it here would take (a model only in the store), as the box's memory budget says now: "free"
    # (room beside what is loaded), "unloads" (room once idle models unload), "waits" (busy models hold the room),
    # "never" (more than the budget, or than pinned models leave); None: loaded, or a box that does not say.
    room: str | None = None
    size_bytes: int | None = None       # its file
    load_s: float | None = None         # a loaded model: seconds its engine took from start to ready


@dataclass(frozen=True)
class GovernorView:
    state: str                          # normal, throttled, emergency, unavailable
    throttle_level: int | None = None   # 0 normal, 1 a GPU at its floor, 2 emergency or failsafe
    reason: str = ""


@dataclass(frozen=True)
class Capabilities:
    box: str
    version: str
    governor: GovernorView
    models: tuple[ModelCapability, ...]
    draining: bool = False              # an update is being applied, or waits for its reboot
    draining_reason: str = ""
    at_unix: float = 0.0
    slot: str = ""                      # the A/B slot the box booted from (or why that cannot be read)
    # The last update's record (update/record.py): its target, phase (staging ... blessed, rolled-back, failed)
    # and reason; empty where the box has none. A fleet's rollout reads what became of each box's update here.
    update_target: str = ""
    update_phase: str = ""
    update_reason: str = ""
    # host_memory_bytes, cpu_count, and accelerators: [{device, description, memory_bytes}] as the loaded
    # models' placements saw them (what `everycycle measure` reports per machine)
    hardware: dict = field(default_factory=dict)
    # The box checks the gateway's vouchers for clients' keys (auth/fleet_vouch.py): the router may send it a
    # client's request with the voucher instead of the fleet key. A box that cannot (not provisioned since, or an
    # older version in a rollout) is sent the fleet key, as before.
    checks_vouchers: bool = False
    # Each vouched key's (KEY@fleet) use here in the last minute and day, [minute, day], under this box's use id:
    # the gateway puts the fleet's in its vouchers, so a key's token limits hold across boxes.
    use_id: str = ""
    vouched_use: dict = field(default_factory=dict)

    def accepts_new_work(self) -> tuple[bool, str]:
        if self.draining:
            return False, f"draining: {self.draining_reason}"
        if self.governor.state == "emergency":
            return False, f"the governor is in emergency ({self.governor.reason})"
        return True, ""

    def routable(self, model: str) -> bool:
        """Whether a request naming `model` can be sent here now."""
        return self.accepts_new_work()[0] and any(m.id == model and m.state in ROUTABLE_STATES for m in self.models)

    def to_wire(self) -> dict:
        return {"object": WIRE_OBJECT, **asdict(self)}

    @classmethod
    def from_wire(cls, doc: dict) -> "Capabilities":
        """The map a box answered; ValueError when it is not one."""
        if not isinstance(doc, dict) or doc.get("object") != WIRE_OBJECT:
            raise ValueError(f"not a capability map (object {doc.get('object') if isinstance(doc, dict) else doc!r})")
        try:
            models = tuple(ModelCapability(**known_fields(ModelCapability, m)) for m in doc["models"])
            governor = GovernorView(**known_fields(GovernorView, doc["governor"]))
            return cls(**{**known_fields(cls, doc), "models": models, "governor": governor})
        except (KeyError, TypeError) as exc:
            raise ValueError(f"a capability map lacks or mistypes a field: {exc}") from None


def known_fields(cls, doc: dict) -> dict:
    """The fields this version knows (a newer box may say more)."""
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in doc.items() if k in names}


def governor_view(state: dict | None, fresh: bool, reason_if_missing: str) -> GovernorView:
    """The governor's published state (its JSON file) as the map says it."""
    if state is None or not fresh:
        return GovernorView("unavailable", None, reason_if_missing)
    level = int(state.get("throttle_level", 0))
    states = sorted({g.get("state", "?") for g in state.get("gpus", [])})
    return GovernorView({0: "normal", 1: "throttled"}.get(level, "emergency"), level,
                        f"GPUs: {', '.join(states)}" if states else "no GPUs governed")


def draining_from_update(last_update: dict | None) -> tuple[bool, str]:
    """An update being copied or written, or installed and waiting for its reboot, drains the box."""
    update = last_update or {}
    phase = update.get("phase")
    if phase in IN_APPLY or phase == INSTALLED:
        return True, f"update to {update.get('target')} is {phase}"
    return False, ""


def update_fields(last_update: dict | None) -> dict:
    """The update record's target, phase and reason as the map's fields."""
    last = last_update or {}
    return {"update_target": str(last.get("target") or ""), "update_phase": str(last.get("phase") or ""),
            "update_reason": str(last.get("reason") or "")}
