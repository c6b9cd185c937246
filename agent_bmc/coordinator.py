"""Collects from a backend on a fixed period, under the agent's own deadline, into the latest snapshot.

The HTTP side only ever reads the snapshot, so it answers at once whatever the BMC does.
A collection that overruns its deadline is abandoned with its session (pyghmi's stays dead),
and reconnection backs off.
"""

from __future__ import annotations

import copy
import datetime as dt
import logging
import threading
import time

from agent_bmc.errors import BmcAuthFailed, BmcCommandFailed, BmcError, BmcTimeout, BmcUnknownHost, BmcUnreachable
from agent_bmc.fan_curve import FanCurve

log = logging.getLogger(__name__)
SCHEMA_VERSION = 1
MAX_EVENTS = 100
MAX_BACKOFF_S = 60.0
# A collection that must open a session also downloads the SDR repository and reads the FRU: on a box whose
# cores are busy with inference it took 7.4 s where a warm one took 3.6 s (0.085 s and 0.008 s idle), so it
# gets this many deadlines before it counts as a timeout.
COLD_DEADLINE_FACTOR = 4
# Failures of the session itself end the attempt; any other failure of one part (no DCMI, a malformed reply)
# leaves that part "unavailable" and keeps the rest.
SESSION_ERRORS = (BmcUnreachable, BmcUnknownHost, BmcAuthFailed, BmcTimeout)


def _iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).isoformat(timespec="seconds")


class Coordinator:
    def __init__(self, backend, period_s: float = 5.0, deadline_s: float = 8.0, fan_curve: FanCurve | None = None):
        self.backend = backend
        self.period_s = period_s
        self.deadline_s = deadline_s
        self.fan_curve = fan_curve
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._seen_sel: set = set()
        self._events: list[dict] = []
        self._fru = None
        self._part_failures: dict[str, str] = {}
        self._fan_state = {"state": "off" if fan_curve is None else "pending"}
        self._backoff = 0.0
        self._snap = {"schema_version": SCHEMA_VERSION, "backend": backend.name, "state": "starting",
                      "detail": "no collection yet", "up": False, "collected_at": None, "collected_unix": None,
                      "sensors": [], "power": None, "power_limit": None, "sel": None, "fru": None,
                      "events": [], "fan_policy": self._fan_state}

    # ---- the view the endpoint serves --------------------------------------------

    def view(self) -> dict:
        with self._lock:
            snap = copy.deepcopy(self._snap)
        age = None if snap["collected_unix"] is None else max(0.0, time.time() - snap["collected_unix"])
        snap["age_s"] = None if age is None else round(age, 3)
        # Stale: the figures are old, or the last collection failed. "none_found" is fresh news, not stale.
        snap["stale"] = age is None or age > 2 * self.period_s + self.deadline_s or \
            snap["state"] not in ("ok", "none_found")
        return snap

    # ---- collection --------------------------------------------------------------

    def run(self) -> None:
        while not self._stop.is_set():
            self.collect_once()
            self._stop.wait(self.period_s + self._backoff)

    def stop(self) -> None:
        self._stop.set()

    def collect_once(self) -> None:
        box: dict = {}

        def work():
            try:
                box["result"] = self._gather()
            except Exception as exc:  # carried back to the coordinator's thread
                box["error"] = exc

        deadline = self.deadline_s if getattr(self.backend, "has_session", True) else \
            self.deadline_s * COLD_DEADLINE_FACTOR
        worker = threading.Thread(target=work, name="bmc-collect", daemon=True)
        worker.start()
        worker.join(deadline)
        if worker.is_alive():
            # The BMC stopped answering mid-call: abandon the call and its session.
            self._fail(BmcTimeout(f"no answer within {deadline:g} s"))
            return
        if "error" in box:
            exc = box["error"]
            self._fail(exc if isinstance(exc, BmcError) else BmcError(f"{type(exc).__name__}: {exc}"))
            return
        self._backoff = 0.0
        with self._lock:
            self._snap.update(box["result"])
            self._snap.update(state="ok" if box["result"]["sensors"] or self.backend.name != "local" else "none_found",
                              detail="collected" if box["result"]["sensors"] else "no sensors found",
                              up=True, collected_unix=time.time(), collected_at=_iso(time.time()),
                              events=list(self._events), fan_policy=dict(self._fan_state))

    def _fail(self, exc: BmcError) -> None:
        drop = getattr(self.backend, "drop", None)
        if drop:
            drop()
        self._backoff = min(MAX_BACKOFF_S, max(1.0, self._backoff * 2)) if not isinstance(exc, BmcAuthFailed) \
            else MAX_BACKOFF_S  # a wrong password will not fix itself: do not hammer the BMC
        log.warning("BMC collection failed (%s): %s; retrying in %.0f s", exc.state, exc, self.period_s + self._backoff)
        with self._lock:
            self._snap.update(state=exc.state, detail=str(exc), up=False)

    def _part(self, name: str, read):
        """One part of a collection on its own: its failure is that part's, said once per kind of failure."""
        try:
            return read()
        except SESSION_ERRORS:
            raise
        except Exception as exc:  # pyghmi and the decoders raise many kinds; the part is what failed
            reason = str(exc) if isinstance(exc, BmcCommandFailed) else f"{type(exc).__name__}: {exc}"
            if self._part_failures.get(name) != reason:
                log.warning("BMC %s unavailable: %s", name, reason)
                self._part_failures[name] = reason
            return {"unavailable": reason}

    def _gather(self) -> dict:
        b = self.backend
        result: dict = {"sensors": b.sensors()}
        if b.name != "ipmi":
            return result
        result["power"] = self._part("power", b.power)
        result["power_limit"] = self._part("power_limit", b.power_limit)
        entries = self._part("sel", b.sel)
        if isinstance(entries, list):
            for e in entries:
                if e["record_id"] not in self._seen_sel:
                    self._seen_sel.add(e["record_id"])
                    self._events.insert(0, {**e, "seen_at": _iso(time.time())})
            del self._events[MAX_EVENTS:]
            result["sel"] = {"count": len(entries)}
        else:
            result["sel"] = entries
        if self._fru is None:
            # Read once: an FRU that cannot be read stays unavailable rather than being asked for every period.
            self._fru = self._part("fru", b.fru)
        result["fru"] = self._fru
        self._apply_fan_policy(result["sensors"])
        return result

    def _apply_fan_policy(self, sensors: list[dict]) -> None:
        if self.fan_curve is None or self._fan_state["state"] == "refused":
            return
        temps = [s["value"] for s in sensors if s["type"] == "temperature" and s["value"] is not None]
        if not temps:
            return
        duty = self.fan_curve.duty(max(temps))
        try:
            self.backend.set_fan_duty(duty)
            self._fan_state = {"state": "applied", "duty_percent": duty}
        except BmcCommandFailed as exc:
            # Said once; the BMC's own fan control stays in charge.
            log.warning("the BMC refused the fan policy (%s); leaving fan control to the BMC", exc)
            self._fan_state = {"state": "refused", "detail": str(exc)}
