"""The governor as a service: read, decide, (in enforce mode) apply, publish; restore defaults on exit.

Publishes, atomically, a JSON state file (per GPU: temperature, power, limit, target, state; the
throttle level; the last state-change events) that the scheduler and the console read, and a
Prometheus text file beside it (node_exporter's textfile format). Before it first changes a limit
it records which cards it touched, so that after a crash the next start restores their defaults.
"""

from __future__ import annotations

import collections
import datetime as dt
import json
import logging
import threading
import time
from pathlib import Path

from host_runtime.common.atomic_file import atomic_write
from host_runtime.common.prometheus_text import exposition
from host_runtime.governor.backends import GovernorBackendError, GpuInfo
from host_runtime.governor.control import GpuController, PowerPolicy, Reading, throttle_level

log = logging.getLogger(__name__)
STATES = ("idle", "controlling", "emergency", "recovering", "failsafe")
MIN_CHANGE_W = 1.0  # smaller moves are not worth a driver call


def _now_iso() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


class Governor:
    def __init__(self, backend, policy: PowerPolicy, *, mode: str, state_path: Path, tick_s: float = 1.0,
                 inlet_source=None, clock=None):
        if mode not in ("observe", "enforce"):
            raise ValueError(f"mode must be observe or enforce, not {mode!r}")
        self.backend = backend
        self.policy = policy
        self.mode = mode
        self.state_path = Path(state_path)
        self.prom_path = self.state_path.with_suffix(".prom")
        self.restore_path = self.state_path.with_name(self.state_path.stem + "-restore.json")
        self.tick_s = tick_s
        self.inlet_source = inlet_source or (lambda: None)
        # The cards' clock: the wall clock for real cards; a simulator running faster than real time brings its own,
        # so the control law's dt and the staleness of readings are in the time the cards live in.
        self.clock = clock or getattr(backend, "clock", time.monotonic)
        self._last_tick: float | None = None
        self.gpus: dict[str, GpuInfo] = {g.gpu_id: g for g in backend.gpus()}
        self.controllers = {gid: GpuController(g.limits, policy) for gid, g in self.gpus.items()}
        self.last_good: dict[str, float] = {gid: self.clock() for gid in self.gpus}
        self.applied: dict[str, float | None] = {gid: None for gid in self.gpus}
        self.touched: set[str] = set()
        self.events: collections.deque = collections.deque(maxlen=50)
        self.latest: dict[str, dict] = {}
        self._stop = threading.Event()

    # ---- lifecycle ---------------------------------------------------------------

    def restore_after_crash(self) -> None:
        """A restore file means the last run changed limits and did not put them back."""
        try:
            touched = json.loads(self.restore_path.read_text()).get("gpus", [])
        except FileNotFoundError:
            return
        except ValueError:
            touched = list(self.gpus)
        if self.mode == "enforce":
            for gid in touched:
                if gid in self.gpus:
                    self._apply(gid, self.gpus[gid].limits.default_w)
            self._event(None, "restored", f"restored default limits left changed by an unclean exit: {touched}")
        self.restore_path.unlink(missing_ok=True)

    def restore_defaults(self) -> None:
        if self.mode == "enforce":
            for gid in sorted(self.touched):
                try:
                    self.backend.set_limit(gid, self.gpus[gid].limits.default_w)
                    self.applied[gid] = self.gpus[gid].limits.default_w
                    if gid in self.latest:
                        self.latest[gid]["applied_limit_w"] = self.applied[gid]
                except GovernorBackendError as exc:
                    log.error("could not restore %s: %s", gid, exc)
                    return  # keep the restore file: the next start tries again
            self._event(None, "restored", f"restored default limits on {sorted(self.touched)}")
        self.restore_path.unlink(missing_ok=True)
        self.touched.clear()
        self.publish()

    def run(self) -> None:
        self.restore_after_crash()
        try:
            while not self._stop.is_set():
                started = time.monotonic()
                now = self.clock()
                self.tick(self.tick_s if self._last_tick is None else now - self._last_tick)
                self._last_tick = now
                self._stop.wait(max(0.0, self.tick_s - (time.monotonic() - started)))
        finally:
            self.restore_defaults()

    def stop(self) -> None:
        self._stop.set()

    # ---- one tick ----------------------------------------------------------------

    def tick(self, dt_s: float) -> None:
        """One control step; dt_s is the time since the last one, on the cards' clock."""
        now = self.clock()
        try:
            readings = {r.gpu_id: r for r in self.backend.read()}
        except GovernorBackendError as exc:
            log.warning("telemetry read failed: %s", exc)
            readings = {}
        inlet = self.inlet_source()
        if inlet is not None and hasattr(self.backend, "set_ambient"):
            self.backend.set_ambient(inlet)  # simulated cards breathe the chassis inlet too
        for gid, ctrl in self.controllers.items():
            r = readings.get(gid)
            if r is not None and r.temperature_c is not None:
                self.last_good[gid] = now
            before = ctrl.state
            limit, state = ctrl.step(Reading(r.temperature_c if r else None, now - self.last_good[gid],
                                             bool(r and r.hw_slowdown)), dt_s, inlet_c=inlet)
            if state != before:
                self._event(gid, state, f"{before} -> {state} at "
                                        f"{'no reading' if not r or r.temperature_c is None else f'{r.temperature_c:.1f} C'}")
            current = self.applied[gid] if self.applied[gid] is not None else (r.limit_w if r else None)
            if current is None or abs(limit - current) >= MIN_CHANGE_W:
                self._apply(gid, limit)
            self.latest[gid] = {
                "id": gid, "name": self.gpus[gid].name,
                "temperature_c": r.temperature_c if r else None, "power_w": r.power_w if r else None,
                # What the card has: our last write in enforce mode, else (or before any write) its own report.
                "applied_limit_w": self.applied[gid] if self.mode == "enforce" and self.applied[gid] is not None
                else (r.limit_w if r else None),
                "decided_limit_w": round(limit, 1), "target_c": round(ctrl.target_c(inlet), 2), "state": state,
                "vram_used_bytes": r.vram_used_bytes if r else None,
                "vram_total_bytes": r.vram_total_bytes if r else None,
                "min_w": self.gpus[gid].limits.min_w, "max_w": self.gpus[gid].limits.max_w,
                "default_w": self.gpus[gid].limits.default_w,
            }
        self.inlet_c = inlet
        self.publish()

    def _apply(self, gid: str, watts: float) -> None:
        if self.mode != "enforce":
            return  # observe-only: the decision is published, nothing is written to the card
        if gid not in self.touched:
            self.touched.add(gid)
            atomic_write(self.restore_path, json.dumps({"gpus": sorted(self.touched)}).encode(), mode=0o600)
        try:
            self.backend.set_limit(gid, watts)
            self.applied[gid] = watts
        except GovernorBackendError as exc:
            log.error("%s", exc)

    def _event(self, gid: str | None, kind: str, text: str) -> None:
        self.events.appendleft({"at": _now_iso(), "gpu": gid, "event": kind, "detail": text})
        log.info("%s%s", f"{gid}: " if gid else "", text)

    # ---- publishing --------------------------------------------------------------

    def throttle(self) -> int:
        gpus = list(self.latest.values())
        return throttle_level([g["state"] for g in gpus], [g["decided_limit_w"] for g in gpus],
                              [g["min_w"] for g in gpus])

    def snapshot(self) -> dict:
        return {"backend": self.backend.name, "mode": self.mode, "updated_at": _now_iso(),
                "updated_unix": time.time(), "throttle_level": self.throttle(),
                "inlet_c": getattr(self, "inlet_c", None), "policy": self.policy.__dict__,
                "gpus": list(self.latest.values()), "events": list(self.events)}

    def publish(self) -> None:
        snap = self.snapshot()
        atomic_write(self.state_path, (json.dumps(snap, indent=2) + "\n").encode(), mode=0o644)
        atomic_write(self.prom_path, prometheus_text(snap).encode(), mode=0o644)


def prometheus_text(snap: dict) -> str:
    """The governor's snapshot as Prometheus text, written by prometheus_client (labels escaped by it)."""
    from prometheus_client.core import GaugeMetricFamily

    p = "everycycle_governor_"

    def families():
        throttle = GaugeMetricFamily(f"{p}throttle_level", "Admission hint: 0 normal, 1 a GPU at its floor, "
                                     "2 emergency or failsafe.", labels=["backend", "mode"])
        throttle.add_metric([str(snap["backend"]), str(snap["mode"])], snap["throttle_level"])
        yield throttle
        series = [("temperature_celsius", "temperature_c", "GPU temperature."),
                  ("power_watts", "power_w", "GPU power draw."),
                  ("decided_limit_watts", "decided_limit_w", "The limit the controller decided."),
                  ("applied_limit_watts", "applied_limit_w", "The limit in force on the card."),
                  ("target_celsius", "target_c", "The temperature target after chassis awareness.")]
        for metric, key, help_text in series:
            family = GaugeMetricFamily(f"{p}{metric}", help_text, labels=["gpu"])
            for g in snap["gpus"]:
                if g[key] is not None:
                    family.add_metric([str(g["id"])], g[key])
            yield family
        state = GaugeMetricFamily(f"{p}state", "The controller's state (1 for the current one).",
                                  labels=["gpu", "state"])
        for g in snap["gpus"]:
            for s in STATES:
                state.add_metric([str(g["id"]), s], int(g["state"] == s))
        yield state

    return exposition(families)
