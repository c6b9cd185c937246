"""`everycycle discover`, `governor`, `console`/`status`, `provision` and `bmc`: the box's other services."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from host_runtime.common import run_layout
from host_runtime.cli.options import _run_dir


def cmd_discover(parser, args) -> int:
    import json

    from host_runtime.discovery import table, topology
    from host_runtime.discovery.watch import TopologyWatcher

    output = Path(args.output) if args.output else run_layout.topology_file(_run_dir())
    if args.print or args.format == "table":
        doc = topology.collect(args.bmc_address)
        print(table.render(doc) if args.format == "table" else json.dumps(doc, indent=2))
        return 0
    try:
        if args.watch:
            from host_runtime.common.stop_signal import stop_on_signals

            watcher = TopologyWatcher(output, args.debounce, args.bmc_address)
            stop_on_signals(watcher.stop)  # supervisord's stop: finish cleanly
            watcher.run()
            return 0
        doc = topology.collect(args.bmc_address)
        topology.write(doc, output)
    except topology.TopologyInvalid as exc:
        print(f"everycycle discover: the collected topology does not validate: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"everycycle discover: cannot write {output}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    print(output)
    return 0


def cmd_governor(parser, args) -> int:
    import json

    from host_runtime.governor.control import PowerPolicy
    from host_runtime.governor.simulate import Scenario, run

    if args.governor_command == "run":
        return cmd_governor_run(parser, args)

    step_c, step_at = 0.0, 0.0
    if args.inlet_step:
        try:
            c, _, at = args.inlet_step.partition("@")
            step_c, step_at = float(c), float(at)
        except ValueError:
            parser.error(f"--inlet-step: expected DEGREES@SECONDS such as 10@300, got {args.inlet_step!r}")
    if args.seconds <= 0:
        parser.error("--seconds: must be more than 0")
    summary = run(Scenario(seconds=args.seconds, ambient_c=args.ambient, inlet_step_c=step_c, inlet_step_at_s=step_at,
                           gpus=args.gpus), PowerPolicy(**({} if args.target is None else {"target_c": args.target})))
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        for g in summary["gpus"]:
            print(f"{g['name']} (simulator): peak {g['peak_temperature_c']} C at {g['peak_at_s']} s, overshoot "
                  f"{g['overshoot_over_target_c']} C, settled after {g['settling_time_s']} s, final limit "
                  f"{g['final_limit_w']} W ({g['final_state']})")
    return 0


def cmd_governor_run(parser, args) -> int:
    from host_runtime.common.stop_signal import stop_on_signals
    from host_runtime.governor.backends import (AmdHwmonBackend, GovernorBackendError, NvmlBackend, SimulatorBackend,
                                                detect_backend)
    from host_runtime.governor.control import PowerPolicy
    from host_runtime.governor.service import Governor

    from host_runtime.common.settings_file import SettingsError
    from host_runtime.common.settings_file import load as load_settings
    from host_runtime.governor.settings import GovernorSettings

    try:
        settings = load_settings(GovernorSettings, args.settings)
    except SettingsError as exc:
        parser.error(f"--settings: {exc}")
    args.backend = args.backend or settings.backend
    from_file = bool(args.settings and os.path.exists(args.settings))
    mode = args.mode or (settings.mode if from_file else "enforce" if args.backend == "simulator" else "observe")
    policy = PowerPolicy(target_c=settings.target_c if args.target is None else args.target,
                         ceiling_c=settings.ceiling_c, safe_fraction=settings.safe_fraction)
    if policy.ceiling_c <= policy.target_c:
        parser.error(f"--target: {policy.target_c} must be under the ceiling, {policy.ceiling_c} C")
    state = Path(args.state) if args.state else run_layout.governor_state_file(_run_dir())
    if args.tick <= 0:
        parser.error("--tick: must be more than 0")
    try:
        if args.backend == "auto":
            backend, passed_over = detect_backend()
            for why in passed_over:
                logging.getLogger("everycycle.governor").info("governor: passed over %s", why)
        elif args.backend == "nvml":
            backend = NvmlBackend()
        elif args.backend == "amdgpu":
            backend = AmdHwmonBackend()
        else:
            backend = SimulatorBackend(args.sim_gpus, args.sim_ambient, args.sim_speed)
    except GovernorBackendError as exc:
        print(f"everycycle governor: --backend {args.backend}: {exc}", file=sys.stderr)
        return 2
    inlet = None
    if args.bmc_url:
        from host_runtime.governor.inlet import BmcInletSource

        inlet = BmcInletSource(args.bmc_url)
    governor = Governor(backend, policy, mode=mode, state_path=state, tick_s=args.tick,
                        inlet_source=inlet)
    stop_on_signals(governor.stop)  # stop, then restore the cards' defaults
    logging.getLogger("everycycle.governor").info("governor: %s backend, %s mode, target %.1f C, ceiling %.1f C, "
                                                  "state in %s", backend.name, mode, policy.target_c,
                                                  policy.ceiling_c, state)
    governor.run()
    return 0


def cmd_console(parser, args) -> int:
    from urllib.parse import urlparse

    from host_runtime.box_status.reader import StatusConfig, StatusReader
    from host_runtime.models.store import default_root as default_store_root

    run_dir = _run_dir(args.run_dir)
    api_scheme, api_port, api_listen, certificate = "http", urlparse(args.serving_url).port or 8080, "0.0.0.0", None
    anchor = lan_name = None
    if args.front_settings:
        from host_runtime.front import settings as front_settings
        from host_runtime.front.tls import certificate_pair
        from host_runtime.front.trust import trust_anchor

        try:
            front = front_settings.load(args.front_settings)
        except front_settings.SettingsError as exc:
            parser.error(f"--front-settings: {exc}")
        api_scheme, api_port, api_listen = "https", front.https_port, front.listen
        pair = certificate_pair(front, Path(args.state_dir or os.path.dirname(args.front_settings)))
        certificate, anchor = pair.trust_anchor, trust_anchor(front, pair)
        lan_name = f"{front_settings.short_hostname()}.local" if front.lan_name else None
    config = StatusConfig(run_dir=run_dir, serving_url=args.serving_url.rstrip("/"), bmc_url=args.bmc_url,
                           serving_socket=Path(args.serving_socket) if args.serving_socket else None,
                           keys_file=Path(args.keys) if args.keys else None,
                           api_port=api_port, api_scheme=api_scheme, api_listen=api_listen, tls_certificate=certificate,
                           tls_anchor=anchor, lan_name=lan_name,
                           provision_root=Path(args.provision_root), bundle_dir=Path(args.bundle_dir),
                           new_keys_file=Path(args.new_keys_file) if args.new_keys_file else None,
                           model_store=default_store_root(),
                           serving_settings=run_layout.serving_settings_file(args.state_dir))
    reader = StatusReader(config)
    if args.command == "status":
        from host_runtime.console.status_text import render

        print(render(reader.read()))
        return 0
    from host_runtime.console.app import Dashboard

    app = Dashboard(reader, tick_s=args.tick, allow_quit=args.allow_quit, watch_terminal=True)
    app.run()
    return app.return_code or 0


def cmd_provision(parser, args) -> int:
    from provisioning.bundle import BundleError, open_bundle

    def read_key(option: str, path: str) -> bytes:
        try:
            return Path(path).read_bytes()
        except OSError as exc:
            parser.error(f"{option}: cannot read {path}: {exc.strerror}")

    try:
        bundle = open_bundle(args.bundle)
    except BundleError as exc:
        print(f"everycycle provision: {exc}", file=sys.stderr)
        return 1
    if args.provision_command == "sign":
        from provisioning.signing import sign

        if bundle.temp_dir is not None:
            bundle.close()
            print("everycycle provision: sign a bundle directory, then pack it; an archive cannot be signed in "
                  "place", file=sys.stderr)
            return 1
        sign(bundle, read_key("--key", args.key))
        print(f"signed {args.bundle}")
        return 0
    with bundle:  # an unpacked archive's temporary directory goes at the end
        return _provision_with(parser, args, bundle, read_key)


def _provision_with(parser, args, bundle, read_key) -> int:
    from provisioning.apply import BundleInvalid, apply
    from provisioning.bundle import BundleError
    from provisioning.validate import validate

    pubkey = read_key("--require-signature", args.require_signature) if args.require_signature else None
    trusted = getattr(args, "trusted_key", None)
    if pubkey is None and trusted and os.path.exists(trusted):
        pubkey = read_key("--trusted-key", trusted)  # the image's baked key: only bundles it signed
    if args.provision_command == "validate":
        errors = validate(bundle, pubkey)
        for e in errors:
            print(f"{e.field}: {e.message}", file=sys.stderr)
        print("valid" if not errors else f"invalid: {len(errors)} problem(s)")
        return 0 if not errors else 1
    try:
        result = apply(bundle, Path(args.root), live_network=args.live_network, require_signature_pem=pubkey,
                       link_wait_s=max(0.0, args.wait_for_links))
    except BundleInvalid as exc:
        for e in exc.errors:
            print(f"{e.field}: {e.message}", file=sys.stderr)
        print(f"refused: {len(exc.errors)} problem(s); nothing was changed", file=sys.stderr)
        return 1
    except (BundleError, OSError) as exc:
        print(f"everycycle provision: apply failed, the previous state is intact: {exc}", file=sys.stderr)
        return 1
    if not result.changed:
        print(f"already applied (bundle {result.digest[:12]}): nothing changed")
        return 0
    print(f"applied bundle {result.digest[:12]}; record: {result.record}")
    if result.generated_keys and args.new_keys_file:
        from host_runtime.auth.new_keys import write_new_keys

        write_new_keys(args.new_keys_file, result.generated_keys)
        print(f"new API key(s) {', '.join(map(repr, result.generated_keys))}: shown once on the console's screen")
    else:
        for name, key in result.generated_keys.items():
            print(f"new API key {name!r}: {key}   (shown once; only its hash is stored)")
    if result.removed_secrets:
        print(f"removed secrets from the bundle: {', '.join(result.removed_secrets)}")
    return 0


def cmd_bmc(parser, args) -> int:
    from agent_bmc.cli import run

    return run(parser, args)
