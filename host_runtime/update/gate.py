"""The health gate of a newly updated slot: it is blessed (systemd-boot stops counting its tries) only when
every supervisord program is RUNNING, /ready answers 200 from a real canary generation and no unit failed.

everycycle-health-gate.service runs this before boot-complete.target on a boot whose entry systemd-boot is
counting; when it fails the unit's FailureAction reboots, so a slot that never passes uses up its tries and
systemd-boot goes back to the other one by itself.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import tenacity

from host_runtime.common.status_sources import serving_get, supervisor_programs
from host_runtime.engine.readiness import QUIET_LIMIT_S, ReadyDeadline

EXPECTED_PROGRAMS = frozenset({"front", "serving", "discovery", "governor", "bmc", "fleet", "fleet-address",
                               "shard-host"})
# supervisord's states that will not become RUNNING without someone's help.
DEAD_STATES = ("FATAL", "EXITED", "STOPPED")
PASS, WAIT, FAIL = "pass", "wait", "fail"
GATE_UNIT = "everycycle-health-gate.service"


def verdict(programs: dict[str, str] | None, ready: tuple[int, str] | None, failed_units: list[str]) -> tuple[str, str]:
    """(PASS | WAIT | FAIL, why) from one look at the box (pure)."""
    failed = [u for u in failed_units if u != GATE_UNIT]
    if failed:
        return FAIL, f"failed units: {', '.join(failed)}"
    if programs is None:
        return WAIT, "supervisord is not answering yet"
    dead = sorted(f"{name} {state}" for name, state in programs.items() if state in DEAD_STATES)
    if dead:
        return FAIL, f"programs that will not run: {', '.join(dead)}"
    missing = sorted(EXPECTED_PROGRAMS - set(programs))
    if missing:
        return FAIL, f"programs missing from supervisord: {', '.join(missing)}"
    starting = sorted(f"{name} {state}" for name, state in programs.items() if state != "RUNNING")
    if starting:
        return WAIT, f"not RUNNING yet: {', '.join(starting)}"
    if ready is None:
        return WAIT, "the serving API is not answering yet"
    status, body = ready
    if status != 200:
        doc = ready_document(body)
        reason = doc.get("reason", body) if doc else body
        if doc and doc.get("state") in ("wedged", "failed"):
            # The engine judged itself from its own measured progress: waiting longer will not help.
            return FAIL, f"the engine is {doc['state']}: {str(reason)[:200]}"
        return WAIT, f"/ready answered {status}: {str(reason)[:200]}"
    return PASS, "every program RUNNING, /ready 200 from a canary generation, no failed units"


def ready_document(body: str) -> dict | None:
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def look(run_dir: Path, serving_socket: Path) -> tuple[dict | None, tuple[int, str] | None, list[str]]:
    """One look at the box: supervisord's programs, /ready over the API's Unix socket, systemd's failed units."""
    try:
        programs = supervisor_programs(run_dir / "supervisor.sock")
    except Exception:  # xmlrpc and socket errors both mean "not answering yet"
        programs = None
    try:
        answer = serving_get("/ready", 60, socket=serving_socket)
        ready = (answer.status, answer.text())
    except OSError:
        ready = None
    out = subprocess.run(["systemctl", "list-units", "--state=failed", "--plain", "--no-legend"],
                         capture_output=True, text=True)
    failed = [line.split()[0] for line in out.stdout.splitlines() if line.strip()]
    return programs, ready, failed


def wait_for_health(timeout_s: float, probe, say, interval_s: float = 5.0, clock=time.monotonic,
                    sleep=time.sleep, quiet_s: float = QUIET_LIMIT_S) -> tuple[bool, str]:
    """Look until the verdict is PASS or FAIL: (passed, why). A box that is still loading or decoding slowly keeps
    its time while /ready shows progress; the wait fails after quiet_s (or twice the engine's wedge bound) with
    no sign of it, or after timeout_s in all."""
    watch = ReadyDeadline(quiet_s=quiet_s, cap_s=timeout_s, clock=clock)
    said = [""]

    def look() -> tuple[str, str]:
        programs, ready, failed = probe()
        watch.observe(ready_document(ready[1]) if ready else None)
        state, why = verdict(programs, ready, failed)
        if why != said[0]:
            say(f"health gate: {state}: {why}")
            said[0] = why
        return state, why

    # Looked at every interval_s while the verdict is WAIT, until the deadline's rule (ReadyDeadline) says enough.
    state, why = tenacity.Retrying(retry=tenacity.retry_if_result(lambda seen: seen[0] == WAIT),
                                   stop=lambda _: watch.failed() is not None, wait=tenacity.wait_fixed(interval_s),
                                   sleep=sleep, retry_error_callback=lambda rs: rs.outcome.result())(look)
    if state == WAIT:
        return False, f"not healthy: {watch.failed()}; {why}"
    return state == PASS, why
