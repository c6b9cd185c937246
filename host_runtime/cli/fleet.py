"""`everycycle fleet`: the gateway, its virtual address, rollouts, status and peers."""

from __future__ import annotations

import sys
from pathlib import Path

from host_runtime.cli.options import _run_dir


def cmd_fleet(parser, args) -> int:
    import threading

    if args.fleet_command == "status":
        return _fleet_status(args)
    if args.fleet_command == "shard-key":
        return _shard_key(parser, args)

    from host_runtime.common.settings_file import SettingsError
    from host_runtime.common.stop_signal import stop_on_signals
    from host_runtime.fleet.settings import load

    try:
        settings = load(args.settings)
    except SettingsError as exc:
        parser.error(f"fleet {args.fleet_command}: --settings: {exc}")
    if args.fleet_command == "peers":
        return _fleet_peers(settings, args)
    if args.fleet_command == "update":
        return _fleet_update(parser, settings, args)
    stop = threading.Event()
    stop_on_signals(stop.set)
    if args.fleet_command == "shard-host":
        return _shard_host(parser, args, settings if args.settings else None, stop)
    if args.fleet_command == "address":
        return _fleet_address(parser, args, settings, stop)
    lan_name = _start_lan_name(parser, args)  # every box, whatever its fleet role: NAME.local on the LAN
    try:
        return _fleet_program(parser, args, settings, stop)
    finally:
        if lan_name is not None:
            lan_name.stop()


def _fleet_address(parser, args, settings, stop) -> int:
    from host_runtime.common.settings_file import SettingsError
    from host_runtime.fleet import vrrp_run
    from host_runtime.fleet.vrrp import FailoverError
    from host_runtime.front import settings as front_settings

    if not settings.virtual_address:
        # supervisord runs this program on every box, like the gateway's: without a virtual address it waits.
        print(f"everycycle fleet address: no virtual_address in {args.settings}; nothing to hold", file=sys.stderr,
              flush=True)
        stop.wait()
        return 0
    try:
        front = front_settings.load(args.front_settings)
    except SettingsError as exc:
        parser.error(f"fleet address: --front-settings: {exc}")
    try:
        vrrp_run.run(settings, front.https_port, Path(args.run_dir))
    except FailoverError as exc:
        print(f"everycycle fleet address: {exc}", file=sys.stderr)
        return 1
    return 0  # not reached: keepalived took this process's place


def _start_lan_name(parser, args):
    """NAME.local announced by mDNS where front.toml says lan_name (the default); None where it does not."""

    from host_runtime.common.settings_file import SettingsError
    from host_runtime.front import settings as front_settings
    from host_runtime.front.lan_name import LanName, LanNameError, lan_addresses

    if not getattr(args, "front_settings", None):
        return None
    try:
        front = front_settings.load(args.front_settings)
    except SettingsError as exc:
        parser.error(f"fleet gateway: --front-settings: {exc}")
    if not front.lan_name or front.loopback_only:
        return None
    name = front_settings.short_hostname()
    lan = LanName(name, front.https_port, lambda: lan_addresses(front.listen))
    try:
        lan.start()
    except LanNameError as exc:
        print(f"everycycle fleet gateway: {exc}", file=sys.stderr, flush=True)
        return None
    return lan


def _fleet_program(parser, args, settings, stop) -> int:
    import dataclasses

    from host_runtime.common.settings_file import SettingsError
    from host_runtime.fleet import router_vocab
    from host_runtime.fleet.gateway import Gateway, GatewayError
    from host_runtime.fleet.settings import FleetSettings, read_key

    if args.if_gateway and settings.role == "member" and settings.mdns:
        return _announce_until(stop, parser, args)
    if args.if_gateway and settings.role != "gateway":
        # supervisord runs this program on every box (the update's health gate wants every program RUNNING):
        # a box that is not the gateway waits here for its stop, at no cost.
        print(f"everycycle fleet gateway: this box is not the fleet's gateway (role {settings.role!r} in "
              f"{args.settings}); nothing to run", file=sys.stderr, flush=True)
        stop.wait()
        return 0
    try:
        given = {"peers": tuple(args.peer) if args.peer else None, "policy": args.policy,
                 "router_port": args.router_port, "metrics_port": args.metrics_port,
                 "poll_interval_s": args.poll_interval, "key_file": args.key_file}
        settings = FleetSettings(**{**dataclasses.asdict(settings), "role": "gateway",
                                    **{k: v for k, v in given.items() if v is not None}})
        key = read_key(settings.key_file)
    except SettingsError as exc:
        parser.error(f"fleet gateway: {exc}")
    vocab = Path(args.vocab_dir) if args.vocab_dir else router_vocab.default_dir()
    if not router_vocab.present(vocab):
        print(f"everycycle fleet gateway: {vocab / router_vocab.FILE_NAME} is missing; fetch it with "
              f"`python -m host_runtime.fleet.router_vocab --dir {vocab}` (make install does)", file=sys.stderr)
        return 1
    from host_runtime.fleet.mdns import MDNSError, PeerBrowser

    browser = PeerBrowser() if settings.mdns else None
    try:
        if browser:
            browser.start()
        return Gateway(settings, key, vocab, Path(args.state) if args.state else None, browser=browser).run(stop)
    except (GatewayError, MDNSError) as exc:
        print(f"everycycle fleet gateway: {exc}", file=sys.stderr)
        return 1
    finally:
        if browser:
            browser.stop()


def _announce_until(stop, parser, args) -> int:
    """A member with mdns = true: its front announced on the LAN until supervisord stops the program."""

    from host_runtime.common.settings_file import SettingsError
    from host_runtime.fleet.mdns import Announcer, MDNSError
    from host_runtime.front import settings as front_settings
    from host_runtime.front.tls import addresses_now
    from host_runtime.update.system import status

    try:
        front = front_settings.load(args.front_settings)
    except SettingsError as exc:
        parser.error(f"fleet gateway: --front-settings: {exc}")
    if front.listen not in ("0.0.0.0", "::"):
        addresses = [front.listen]
    else:
        addresses = sorted(str(a) for a in addresses_now() if a.version == 4 and not a.is_loopback)
    if not addresses:
        print("everycycle fleet gateway: no LAN address to announce yet; waiting", file=sys.stderr, flush=True)
        stop.wait()
        return 0
    name = front_settings.short_hostname()
    announcer = Announcer(name, addresses, front.https_port,
                          {"role": "member", "version": str(status(with_entries=False).get("version", ""))[:60]})
    try:
        announcer.start()
    except MDNSError as exc:
        print(f"everycycle fleet gateway: {exc}", file=sys.stderr)
        return 1
    print(f"everycycle fleet gateway: a member; announcing https port {front.https_port} on "
          f"{', '.join(addresses)} by mDNS", file=sys.stderr, flush=True)
    try:
        stop.wait()
    finally:
        announcer.stop()
    return 0


def _fleet_update(parser, settings, args) -> int:
    from concurrent.futures import ThreadPoolExecutor

    from host_runtime.common.settings_file import SettingsError
    from host_runtime.fleet import rollout_run
    from host_runtime.fleet.peers import peer_client, tls_context
    from host_runtime.fleet.rollout import Rollout
    from host_runtime.fleet.settings import OWN_API, read_key

    try:
        key = read_key(settings.key_file)
    except SettingsError as exc:
        parser.error(f"fleet update: {exc}")
    boxes = tuple(args.box or (p for p in settings.peers if p.rstrip("/") != f"http://{OWN_API}"))
    if not boxes:
        parser.error("fleet update: no members to update (fleet.toml's peers, or --box)")
    if not Path(args.ssh_key).is_file():
        parser.error(f"fleet update: --ssh-key: {args.ssh_key} is not a file")
    target = args.target
    if not target:
        from host_runtime.update import service
        from host_runtime.update.errors import UpdateError
        from host_runtime.update.fetch import Source
        from host_runtime.update.system import UpdatePaths

        try:
            target = service.check(Source(args.source), UpdatePaths())["available"]
        except UpdateError as exc:
            print(f"everycycle fleet update: {exc} (or name the version with --target)", file=sys.stderr)
            return 1
    known_hosts = args.known_hosts or rollout_run.default_known_hosts()
    rollout = Rollout(target, boxes, timeout_s=args.timeout)
    started: list = []

    def start(box: str):
        handle = rollout_run.SSHStart(rollout_run.ssh_argv(box, args.source, args.ssh_key, known_hosts))
        started.append(handle)
        return handle

    def say(step) -> None:
        print(" ".join(filter(None, (step.action, step.box))) + (f": {step.why}" if step.why else ""), flush=True)

    try:
        with peer_client(tls_context(settings.peer_certificates)) as client, ThreadPoolExecutor(len(boxes)) as pool:
            last = rollout_run.drive(rollout, rollout_run.reader(boxes, key, client, pool), start, say,
                                     interval_s=args.interval)
    except KeyboardInterrupt:
        print(f"everycycle fleet update: interrupted; {rollout.current or 'no box'} was updating, "
              f"done: {', '.join(rollout.done) or 'none'}", file=sys.stderr)
        return 130
    return 0 if last.action == "done" else 1


def _fleet_status(args) -> int:
    import json as json_module
    import time as time_module

    from host_runtime.common.run_layout import fleet_state_file
    from host_runtime.fleet.state import GatewayState, render

    path = Path(args.state) if args.state else fleet_state_file(_run_dir(args.run_dir))
    try:
        state = GatewayState.from_json(json_module.loads(path.read_text()))
    except FileNotFoundError:
        print(f"everycycle fleet status: no {path}: this box is not the fleet's gateway, or its gateway has not "
              f"polled yet", file=sys.stderr)
        return 1
    except (OSError, ValueError, TypeError) as exc:
        print(f"everycycle fleet status: {path} cannot be read: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json_module.dumps(state.to_json(), indent=1))
    else:
        print("\n".join(render(state, time_module.time())))
    return 0


def _fleet_peers(settings, args) -> int:
    import json as json_module
    import time as time_module

    from host_runtime.fleet.controller import merge_peers
    from host_runtime.fleet.mdns import MDNSError, PeerBrowser

    found: tuple[str, ...] = ()
    if settings.mdns:
        browser = PeerBrowser()
        try:
            browser.start()
            time_module.sleep(args.wait)
            found = browser.peers()
        except MDNSError as exc:
            print(f"everycycle fleet peers: {exc}", file=sys.stderr)
            return 1
        finally:
            browser.stop()
    # Found boxes are polled only where peer_certificates can vouch for them (fleet/gateway.trusted_found).
    trusted = found if settings.peer_certificates else ()
    peers = merge_peers(settings.peers, trusted)
    untrusted = [u for u in found if u not in trusted and u not in settings.peers]
    if args.json:
        print(json_module.dumps({"configured": list(settings.peers), "found_by_mdns": list(found),
                                 "peers": list(peers), "found_untrusted": untrusted}, indent=1))
    else:
        for p in peers:
            print(p + ("  (mDNS)" if p in found and p not in settings.peers else ""))
        for p in untrusted:
            print(f"{p}  (mDNS, not polled: name its certificate in peer_certificates)")
    return 0


def _shard_host(parser, args, settings, stop) -> int:
    """settings: fleet.toml's, read by cmd_fleet (None: no --settings, the options alone)."""
    from host_runtime.common.settings_file import SettingsError
    from host_runtime.fleet.settings import read_key
    from host_runtime.gpu.llama_build import load_first, select

    listen = args.listen or (settings.shard_listen if settings else "")
    if not listen:
        if args.if_lending:
            # supervisord runs this program on every box (the update's health gate wants every program RUNNING):
            # a box that lends nothing waits here for its stop, at no cost.
            print(f"everycycle fleet shard-host: this box lends nothing (no shard_listen in {args.settings}); "
                  "nothing to run", file=sys.stderr, flush=True)
            stop.wait()
            return 0
        parser.error("fleet shard-host: --listen: required (or --settings with shard_listen)")
    from host_runtime.shard import wire_key

    try:
        wire_key.check_member_address(listen)
    except ValueError as exc:
        parser.error(f"fleet shard-host: --listen: {exc}")
    if args.key_file:
        try:
            secrets = wire_key.secrets_text(read_key(args.key_file), [listen])
        except SettingsError as exc:
            parser.error(f"fleet shard-host: --key-file: {exc.message}")
    elif args.wire_key_file or settings:
        secrets = _own_wire_key(parser, args.wire_key_file or settings.shard_wire_key_file, listen)
    else:
        parser.error("fleet shard-host: one of --key-file, --wire-key-file or --settings is required")
    lend_mib = args.lend_mib or (settings.shard_lend_mib if settings else 0)
    select()
    load_first()
    from host_runtime.shard.member import lend

    return lend(listen, secrets, cache_dir=args.cache_dir, n_threads=args.threads or 0,
                cap_bytes=lend_mib << 20 if lend_mib else None,
                on_ready=lambda devices: print(f"everycycle fleet shard-host: lending "
                                               f"{', '.join(d.name for d in devices)} on {listen}", flush=True))


def _own_wire_key(parser, path: str, listen: str) -> str:
    """A member's own wire key file: read by the fleet key's rules (0600, one word), and for the address it
    listens on."""
    from host_runtime.common.settings_file import SettingsError
    from host_runtime.fleet.settings import read_key
    from host_runtime.shard.wire_key import own_secret

    try:
        return own_secret(read_key(path), listen)
    except SettingsError as exc:
        parser.error(f"fleet shard-host: --wire-key-file: {exc.message}")
    except ValueError as exc:
        parser.error(f"fleet shard-host: --wire-key-file: {path} {exc}")


def _shard_key(parser, args) -> int:
    from host_runtime.common.settings_file import SettingsError
    from host_runtime.fleet.settings import read_key
    from host_runtime.shard.wire_key import secrets_text

    try:
        key = read_key(args.key_file)
    except SettingsError as exc:
        parser.error(f"fleet shard-key: --key-file: {exc.message}")
    sys.stdout.write(secrets_text(key, args.member))
    if len(args.member) == 1:
        print(f"everycycle fleet shard-key: {args.member[0]}'s own wire key: put it on that box in a 0600 file for "
              "its shard-host --wire-key-file (or on its holder, for serve --shard-key-file)", file=sys.stderr)
    else:
        print(f"everycycle fleet shard-key: the wire keys of {', '.join(args.member)}: put them on their holder in "
              "a 0600 file for serve --shard-key-file", file=sys.stderr)
    return 0
