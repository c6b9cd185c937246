"""`everycycle front`: the front's nginx, its certificate and what clients trust."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from host_runtime.cli.options import _run_dir


def cmd_front(parser, args) -> int:
    from host_runtime.front import settings as front_settings
    from host_runtime.front.run import FrontError, prepare, run_nginx
    from host_runtime.front.tls import TLSError, fingerprint

    try:
        settings = front_settings.load(args.settings)
    except front_settings.SettingsError as exc:
        parser.error(f"--settings: {exc}")
    state_dir = Path(args.state_dir)
    try:
        if args.action in ("fingerprint", "ca"):
            return _front_trust(args, settings, state_dir)
        if args.action == "import":
            return _front_import(parser, args, state_dir)
        if not args.run_dir or not args.upstream_socket:
            parser.error("front run: --run-dir and --upstream-socket are required")
        gateway_port = None
        if args.fleet_settings:
            from host_runtime.common.settings_file import SettingsError
            from host_runtime.fleet.settings import load as load_fleet

            try:
                fleet = load_fleet(args.fleet_settings)
            except SettingsError as exc:
                parser.error(f"--fleet-settings: {exc}")
            gateway_port = fleet.router_port if fleet.role == "gateway" else None
        conf, pair = prepare(settings, state_dir, Path(args.run_dir), Path(args.upstream_socket), gateway_port)
        logging.getLogger("everycycle.front").info(
            "front on %s: HTTPS port %d (certificate %s, %s, SHA-256 %s), HTTP port %d %s, /metrics %s",
            settings.listen, settings.https_port, pair.certificate, pair.kind, fingerprint(pair.trust_anchor),
            settings.http_port, settings.http, settings.metrics)
        return run_nginx(conf, Path(args.run_dir), settings, pair)
    except (FrontError, TLSError) as exc:
        print(f"everycycle front: {exc}", file=sys.stderr)
        return 1


def _front_import(parser, args, state_dir: Path) -> int:
    from host_runtime.front.owner_certificate import import_pair, restart_front, use_local_ca

    if not args.settings:
        parser.error("front import: --settings (front.toml) is required: it is what names the certificate")
    if args.local_ca == bool(args.certificate or args.private_key):
        parser.error("front import: give --certificate and --private-key, or --local-ca")
    if not args.local_ca and not (args.certificate and args.private_key):
        parser.error("front import: --certificate and --private-key go together")
    done = (use_local_ca(Path(args.settings)) if args.local_ca else
            import_pair(Path(args.settings), state_dir, Path(args.certificate), Path(args.private_key)))
    print(f"{done}; {restart_front(_run_dir())}")
    return 0


def _front_trust(args, settings, state_dir: Path) -> int:
    """`front fingerprint`: the served certificate's; `front ca`: what a client trusts, and how."""
    from host_runtime.front.tls import certificate_pair, fingerprint, self_signed_paths
    from host_runtime.front.trust import trust_anchor, trust_lines

    pair = certificate_pair(settings, state_dir)
    if args.action == "ca" and args.adopt:
        if pair.kind != "self-signed":
            print(f"everycycle front ca --adopt: nothing to adopt: this box serves "
                  f"{'its local CA' if pair.ca else 'its owner'}'s certificate", file=sys.stderr)
            return 1
        legacy = self_signed_paths(state_dir)
        for path in (legacy.certificate, legacy.private_key):
            path.replace(path.with_name(path.name + ".retired"))
        print("the self-signed certificate is retired; restart the front (supervisorctl restart front) to make "
              "the local CA and serve its certificate, then trust the CA on each client (everycycle front ca)")
        return 0
    shown = pair.trust_anchor if args.action == "ca" else pair.certificate
    if not shown.exists():
        print("no certificate yet: the front makes one when it first starts", file=sys.stderr)
        return 1
    if args.action == "fingerprint":
        print(f"{fingerprint(shown)}  {shown}  ({pair.kind})")
        return 0
    shown_print = fingerprint(shown)
    print(f"{'local CA' if pair.ca else pair.kind + ' certificate'}  {shown}")
    print(f"SHA-256  {shown_print}")
    if pair.kind == "self-signed":
        print("this box made a self-signed certificate before it had a local CA, and its clients trust that one; "
              "`everycycle front ca --adopt` moves it to the CA (which survives address changes)")
    print("\n".join(trust_lines(trust_anchor(settings, pair), shown_print)))
    return 0
