"""`everycycle measure`: measure this box, or the fleet from its gateway, and write measurements.json and
(with --doc) the design document made from it."""

from __future__ import annotations

import argparse
import json
import ssl
import sys
from pathlib import Path


def add_parser(sub) -> None:
    m = sub.add_parser("measure", help="measure the box (or the fleet) against box.toml's [requirement]; write the "
                                       "figures as JSON and the design document made from them",
                       description="Measures each box's links, prefill, decode, KV size and cache tiers, and the "
                                   "requirement's load through the endpoint. Every figure gets a label in the JSON; "
                                   "the document cites them.")
    m.add_argument("--fleet", action="store_true",
                   help="every box in fleet.toml's peers (run on the gateway), with the fleet key")
    m.add_argument("--url", default="http://127.0.0.1:8080",
                   help="the endpoint clients use: this box's API, or with --fleet the gateway's front "
                        "(default http://127.0.0.1:8080)")
    m.add_argument("--key-file", metavar="FILE", help="a file holding an API key for --url (without --fleet)")
    m.add_argument("--ca-cert", metavar="PEM", help="trust this certificate for an https --url (a self-signed front)")
    m.add_argument("--fleet-settings", default="/etc/everycycle/fleet.toml", metavar="FILE",
                   help="with --fleet: peers, fleet key file and peer certificates (default /etc/everycycle/fleet.toml)")
    m.add_argument("--box-toml", default="/etc/everycycle/box.toml", metavar="FILE",
                   help="where [requirement] is read (default /etc/everycycle/box.toml; absent: the defaults)")
    m.add_argument("--fleet-bench", metavar="PATH",
                   help="with --fleet: bench/fleet.py's JSON (cache_aware against round robin), cited in the document")
    m.add_argument("--json", required=True, metavar="PATH", help="where measurements.json goes")
    m.add_argument("--doc", metavar="PATH", help="where the design document (Markdown) goes")


def run(parser: argparse.ArgumentParser, args) -> int:
    from host_runtime.common.atomic_file import atomic_write
    from host_runtime.common.http_client import HTTPFailure
    from host_runtime.common.settings_file import SettingsError
    from host_runtime.fleet.peers import tls_context
    from host_runtime.measure import report as report_doc
    from host_runtime.measure.probes import ProbeError, Target
    from host_runtime.measure.requirement import load as load_requirement
    from host_runtime.measure.survey import survey

    try:
        requirement = load_requirement(args.box_toml)
    except SettingsError as exc:
        parser.error(f"--box-toml: {exc}")
    bench = None
    if args.fleet_bench:
        if not args.fleet:
            parser.error("--fleet-bench: only with --fleet")
        try:
            bench = json.loads(Path(args.fleet_bench).read_text())
        except (OSError, ValueError) as exc:
            parser.error(f"--fleet-bench: {exc}")
        try:  # checked before minutes of measuring, not after
            report_doc.Report("fleet", requirement).add_router_bench(bench if isinstance(bench, dict) else {}, "")
        except ValueError as exc:
            parser.error(f"--fleet-bench: {exc}")
    if args.fleet:
        from host_runtime.fleet import settings as fleet_settings

        try:
            settings = fleet_settings.load(args.fleet_settings)
            key = fleet_settings.read_key(settings.key_file)
        except SettingsError as exc:
            parser.error(f"--fleet-settings: {exc}")
        if not settings.peers:
            parser.error(f"--fleet-settings: {args.fleet_settings} lists no peers")
        try:
            peers_context = tls_context(settings.peer_certificates)
            endpoint_context = tls_context((args.ca_cert,) if args.ca_cert else ())
        except (OSError, ssl.SSLError) as exc:
            parser.error(f"a certificate cannot be read: {exc}")
        boxes = [Target(p, key, peers_context) for p in settings.peers]
        endpoint = Target(args.url, key, endpoint_context)
        # The gateway is the peer on this box: its own API, which provisioning lists as fleet_settings.OWN_API.
        gateway = next((i for i, p in enumerate(settings.peers) if p.rstrip("/") == f"http://{fleet_settings.OWN_API}"),
                       None)
    else:
        if not args.key_file:
            parser.error("--key-file: needed without --fleet (a file holding an API key for --url)")
        try:
            key = Path(args.key_file).read_text().strip()
            context = tls_context((args.ca_cert,) if args.ca_cert else ())
        except (OSError, ssl.SSLError) as exc:
            parser.error(f"--key-file/--ca-cert: {exc}")
        if not key:
            parser.error(f"--key-file: {args.key_file} is empty")
        endpoint = Target(args.url, key, context)
        boxes, gateway = [endpoint], None
    try:
        result = survey(boxes, endpoint, requirement, scope="fleet" if args.fleet else "box", gateway=gateway,
                        endpoint_is_box=not args.fleet, progress=lambda s: print(f"measure: {s}", file=sys.stderr))
    except (ProbeError, HTTPFailure) as exc:  # HTTPFailure: an answer that broke off while it was read
        print(f"everycycle measure: {exc}", file=sys.stderr)
        return 1
    if bench is not None:
        try:
            result.add_router_bench(bench, args.fleet_bench)
        except ValueError as exc:
            parser.error(f"--fleet-bench: {exc}")
    doc = result.to_json()
    atomic_write(Path(args.json), (json.dumps(doc, indent=1) + "\n").encode(), 0o644)
    print(f"measure: {len(doc['figures'])} figures in {args.json}", file=sys.stderr)
    if args.doc:
        text = report_doc.render(doc)
        problems = report_doc.check(text, doc)
        if problems:  # the renderer's own bug: never write a document whose figures are not the JSON's
            print("everycycle measure: the document does not match its figures:\n  " + "\n  ".join(problems),
                  file=sys.stderr)
            return 1
        atomic_write(Path(args.doc), text.encode(), 0o644)
        print(f"measure: design document in {args.doc}", file=sys.stderr)
    return 0
