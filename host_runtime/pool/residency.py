"""Which models stay loaded (pure): room for a model within the memory budget, made by unloading the least
recently used idle models first (Ollama's keep_alive semantics: an idle model unloads once its keep-alive has
passed; pinned models never unload). The serving side acts on these decisions."""

from __future__ import annotations

from dataclasses import dataclass

KEEP_ALIVE_S = 300.0  # how long an idle model loaded on demand stays (Ollama's default, 5m)


@dataclass(frozen=True)
class Resident:
    name: str
    bytes: int              # what it holds: weights, KV, compute buffers (measured once loaded)
    last_used: float        # when a request last named it
    busy: bool              # requests running or waiting on it
    pinned: bool = False
    keep_alive_s: float | None = KEEP_ALIVE_S  # None: forever (Ollama's keep_alive -1)


@dataclass(frozen=True)
class LoadPlan:
    evict: tuple[str, ...] = ()   # unload these, in this order, first
    wait: bool = False            # room will come when busy models go idle: try again shortly
    shortfall: int = 0            # > 0: the model cannot fit even alone; this many bytes are missing
    pinned_hold: int = 0          # > 0: pinned models hold so much of the room that it cannot fit beside them

    @property
    def fits(self) -> bool:
        return not self.wait and not self.shortfall and not self.pinned_hold


def plan_load(need: int, budget: int, residents: list[Resident]) -> LoadPlan:
    """How to make room for a model needing `need` bytes."""
    if need > budget:
        return LoadPlan(shortfall=need - budget)
    free = budget - sum(r.bytes for r in residents)
    evict = []
    for r in sorted((r for r in residents if not r.busy and not r.pinned), key=lambda r: r.last_used):
        if free >= need:
            break
        evict.append(r.name)
        free += r.bytes
    if free >= need:
        return LoadPlan(evict=tuple(evict))
    if free + sum(r.bytes for r in residents if r.busy and not r.pinned) >= need:
        return LoadPlan(wait=True)
    return LoadPlan(pinned_hold=sum(r.bytes for r in residents if r.pinned))


def load_room(plan: LoadPlan) -> str:
    """A plan as the capability map says it (fleet/capabilities.ModelCapability.room)."""
    if plan.shortfall or plan.pinned_hold:
        return "never"
    return "waits" if plan.wait else "unloads" if plan.evict else "free"


def expired(residents: list[Resident], now: float) -> list[str]:
    """Idle, unpinned models whose keep-alive has run out since they were last used."""
    return [r.name for r in residents
            if not r.busy and not r.pinned and r.keep_alive_s is not None and now - r.last_used >= r.keep_alive_s]


def expires_in(keep_alive_s: float | None, last_used: float, now: float) -> float | None:
    """Seconds until an idle model's keep-alive unloads it (None: it stays), counted from its last use."""
    return None if keep_alive_s is None else max(0.0, last_used + keep_alive_s - now)


def parse_keep_alive(value) -> float | None:
    """Ollama's forms: seconds as a number, a duration string ('5m', '1h', '30s'), or negative for forever."""
    if isinstance(value, bool):
        raise ValueError("keep_alive must be a number of seconds or a duration such as '5m'")
    if isinstance(value, (int, float)):
        return None if value < 0 else float(value)
    if isinstance(value, str):
        text = value.strip().lower()
        units = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
        for unit in ("ms", "s", "m", "h"):
            if text.endswith(unit):
                number = text[:-len(unit)]
                try:
                    seconds = float(number) * units[unit]
                except ValueError:
                    break
                return None if seconds < 0 else seconds
        try:
            seconds = float(text)
        except ValueError:
            pass
        else:
            return None if seconds < 0 else seconds
    raise ValueError(f"keep_alive must be a number of seconds or a duration such as '5m', got {value!r}")
