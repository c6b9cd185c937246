"""`everycycle update check | apply | status | boot | gate`: the command line over service.py."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from host_runtime.update import service, system
from host_runtime.update.errors import UpdateError
from host_runtime.update.fetch import Source

# The gate's outer limit; before it, a box gets as long as /ready shows progress (engine/readiness.py).
DEFAULT_GATE_TIMEOUT_S = 3600.0


def add_parser(sub) -> None:
    up = sub.add_parser("update", help="update the box's system from a signed release (A/B slots, health-gated)")
    up_sub = up.add_subparsers(dest="update_command", metavar="ACTION", required=True)
    check = up_sub.add_parser("check", help="verify the release at --from and say whether it is newer")
    apply = up_sub.add_parser("apply", help="verify, copy and write a release into the idle slot")
    for p in (check, apply):
        p.add_argument("--from", dest="source", required=True, metavar="DIR-or-URL",
                       help="a folder (a USB stick) or an http(s) URL on the LAN holding SHA256SUMS, its .sig and "
                            "the release's files (`make image` writes them to build/image/out/update)")
    apply.add_argument("--allow-downgrade", action="store_true", help="accept a release older than the running one")
    apply.add_argument("--reboot", action="store_true", help="restart into the new slot once it is written")
    for p in (check, up_sub.add_parser("status", help="the running version and slot, boot entries, last update")):
        p.add_argument("--json", action="store_true", help="one JSON document")
    up_sub.add_parser("boot", help="(early boot, by everycycle-update-boot.service) carry the configuration into "
                                   "a new slot and record what the boot loader did")
    gate = up_sub.add_parser("gate", help="(by everycycle-health-gate.service) pass only when the box is healthy")
    gate.add_argument("--timeout", type=float, default=DEFAULT_GATE_TIMEOUT_S, metavar="S",
                      help=f"seconds the box has to become healthy in all, however it progresses (default "
                           f"{DEFAULT_GATE_TIMEOUT_S:.0f}); it fails sooner after 300 s without progress")
    gate.add_argument("--run-dir", type=Path, default=Path("/run/everycycle"), metavar="DIR")


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def run(parser: argparse.ArgumentParser, args) -> int:
    paths = system.UpdatePaths()
    try:
        return _run(args, paths)
    except UpdateError as exc:
        print(f"everycycle update {args.update_command}: {exc}", file=sys.stderr)
        return 1


def _run(args, paths: system.UpdatePaths) -> int:
    command = args.update_command
    if command == "status":
        state = system.status(paths)
        if args.json:
            print(json.dumps(state, indent=2))
        else:
            print(f"running {state['version']} from slot {state['slot']}")
            for e in state["boot_entries"]:
                tries = "kept (not counting)" if e["tries_left"] is None else \
                    f"{e['tries_left']} tries left, {e['tries_done']} used"
                print(f"  boot entry {e['name']}: {tries}")
            last = state["last_update"]
            print(f"last update: {last['target']} from {last['from']}: {last['phase']} ({last['reason']}) at "
                  f"{last['updated_at']}" if last else "last update: none")
        return 0
    if command == "check":
        found = service.check(Source(args.source), paths)
        if args.json:
            print(json.dumps(found, indent=2))
        else:
            verdict = "newer: `everycycle update apply` installs it" if found["newer"] else \
                "older (a downgrade needs --allow-downgrade)" if found["older"] else "the running version"
            print(f"running {found['running']}; {args.source} offers {found['available']}, signed: {verdict}")
        return 0
    if command == "apply":
        release = service.apply(Source(args.source), paths, _say, allow_downgrade=args.allow_downgrade)
        print(f"{release.version} is written to the idle slot; it boots next, with {service.TRIES} tries to pass "
              f"its health gate before the box goes back to this one")
        if args.reboot:
            subprocess.run(["systemctl", "reboot"], check=False)
        return 0
    if command == "boot":
        service.on_boot(paths, _say)
        return 0
    if command == "gate":
        ok = service.health_gate(paths, args.timeout, args.run_dir, args.run_dir / "serving/http.sock", _say)
        return 0 if ok else 1
    raise AssertionError(command)
