"""`everycycle`'s whole command line: every subcommand and its options."""

from __future__ import annotations

import argparse

from host_runtime import __version__
from host_runtime.governor.settings import GovernorSettings
from host_runtime.cli.options import (SERVE_SETTINGS, _add_engine_options, _add_placement_options, _host_port, _port,
                                      _positive, _positive_float, add_setting_flags)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="everycycle", description="EveryCycle inference box services.")
    parser.add_argument("--version", action="version", version=f"everycycle {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    serve = sub.add_parser("serve", help="run the OpenAI-compatible serving API in the foreground",
                           description="Run the OpenAI-compatible API (gunicorn) and its inference engine.")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; 0.0.0.0 for the LAN)")
    serve.add_argument("--port", type=_port, default=8080, help="port to bind (default 8080)")
    serve.add_argument("--also-listen", metavar="HOST:PORT", type=_host_port,
                       help="listen here too (the fleet gateway's router reaches its own box's API on loopback)")
    serve.add_argument("--fleet-router", metavar="HOST:PORT", type=_host_port,
                       help="on the fleet's gateway: the router's loopback address, asked which models the fleet has "
                            "when it could not route a request (serving.toml's fleet_router)")
    serve.add_argument("--fleet-state", metavar="FILE",
                       help="on the fleet's gateway: the fleet program's state file, whose view of each key's use "
                            "across the boxes goes into the vouchers (default: RUN_DIR/fleet/fleet.json)")
    serve.add_argument("--keys", metavar="FILE", help="API key file (from 'everycycle keys create'); without it the API is open")
    serve.add_argument("--prefix-cache-shared", action="store_true",
                       help="let every API key's requests reuse each other's cached prompt prefixes (default: each key "
                            "finds only its own, so a hit tells no key about another's prompts; serving.toml's "
                            "prefix_cache_shared)")
    serve.add_argument("--workers", type=_positive, default=2, metavar="N", help="HTTP worker processes (default 2)")
    serve.add_argument("--http-threads", type=_positive, metavar="N",
                       help="threads per HTTP worker (default: every request the engine admits, running or queued, "
                            "plus 16 for health and metrics; at least 32)")
    serve.add_argument("--max-body-bytes", type=_positive, default=1 << 20, metavar="N",
                       help="request body limit, images' base64 aside (default 1 MiB)")
    serve.add_argument("--max-media-body-bytes", type=_positive, default=32 << 20, metavar="N",
                       help="a generation's body limit with its images (default 32 MiB; the rest keeps "
                            "--max-body-bytes)")
    serve.add_argument("--ready-wait", type=_positive_float, default=2.0, metavar="S",
                       help="how long a /ready probe waits for the canary generation that runs before it answers from "
                            "the engine's progress (default 2); slow is not wedged, see --wedge-floor")
    serve.add_argument("--run-dir", metavar="DIR", help="where the engine socket lives (default: a private temp dir)")
    serve.add_argument("--settings", metavar="FILE",
                       help="serving.toml (written by provisioning from box.toml's [model]); options given here win")
    serve.add_argument("--unix-socket", metavar="PATH",
                       help="listen on this Unix socket instead of --host/--port (behind the front, as on the box)")
    serve.add_argument("--front-settings", metavar="FILE",
                       help="the front's settings (front.toml): /metrics access follows its 'metrics' setting")
    serve.add_argument("--metrics-access", choices=["open", "key", "loopback"],
                       help="who may read /metrics (default: from --front-settings, else 'key')")
    serve.add_argument("--model-store", metavar="DIR",
                       help="models a request may name, loaded on demand (default: $EVERYCYCLE_MODEL_STORE, else "
                            "/var/lib/everycycle/models)")
    add_setting_flags(serve, SERVE_SETTINGS)
    serve.add_argument("--usage-dir", metavar="DIR",
                       help="keep per-key usage here across restarts (default: serving.toml's usage_dir; without "
                            "one, in memory only)")
    serve.add_argument("--trace-endpoint", metavar="URL",
                       help="send each request's trace (OpenTelemetry spans) to this OTLP/HTTP collector, e.g. "
                            "http://10.0.0.5:4318 (default: serving.toml's trace_endpoint; without one, no tracing)")
    serve.add_argument("--engine-socket", metavar="PATH",
                       help="use an engine already running at this socket instead of starting one")
    _add_engine_options(serve)

    front = sub.add_parser("front", help="the LAN-facing front: nginx with TLS and slow-client limits before the API",
                           description="Run nginx in front of the serving API (TLS, timeouts, per-client limits), "
                                       "or show the certificate clients trust and how to trust it.")
    front.add_argument("action", choices=["run", "fingerprint", "ca", "import"],
                       help="run: write nginx's config and run it in the foreground; fingerprint: print the "
                            "served certificate's SHA-256 fingerprint; ca: the certificate clients trust (the "
                            "box's local CA), its fingerprint, where to fetch it and how each client trusts it; "
                            "import: serve the owner's own certificate (--certificate, --private-key), or the "
                            "local CA's again (--local-ca), and restart the front")
    front.add_argument("--adopt", action="store_true",
                       help="ca: retire the self-signed certificate a box made before it had a local CA")
    front.add_argument("--certificate", metavar="PEM", help="import: the owner's certificate (its chain after it)")
    front.add_argument("--private-key", metavar="PEM", help="import: its private key (unencrypted PEM)")
    front.add_argument("--local-ca", action="store_true", help="import: serve the local CA's certificate again")
    front.add_argument("--settings", metavar="FILE", help="the front's settings (front.toml; defaults without it)")
    front.add_argument("--state-dir", required=True, metavar="DIR",
                       help="where the box's local CA and the front's certificate are kept")
    front.add_argument("--run-dir", metavar="DIR", help="nginx's config, pid and temp files (run)")
    front.add_argument("--upstream-socket", metavar="PATH", help="the serving API's Unix socket (run)")
    front.add_argument("--fleet-settings", metavar="FILE", help="fleet.toml: on the fleet's gateway, /v1/ goes to the "
                                                                "fleet's router once this box's API accepts the key")

    plan = sub.add_parser("plan", help="how a model would be placed over this box's GPUs and CPU, and whether it fits",
                          description="Plan a model's placement (layers per device, weights, KV, compute, margin), "
                                      "proven with llama.cpp's own dry run. Exit 0 when it fits, 1 when it does not.")
    plan.add_argument("--model", metavar="PATH", help="GGUF model file (default: the embedded SmolLM2-135M-Instruct)")
    add_setting_flags(plan, ("context_length", "parallel", "kv_budget_mib", "cache_type_k", "cache_type_v",
                             "models_memory_mib"))
    plan.add_argument("--batch", type=_positive, default=512, metavar="N", help="prompt tokens per step (default 512)")
    plan.add_argument("--topology", metavar="FILE",
                      help="plan for the devices in this topology file (from 'everycycle discover') instead of the "
                           "live ones; such a plan is not proven, as llama.cpp can only size devices it has")
    plan.add_argument("--mmproj", metavar="PATH",
                      help="the model's projector GGUF: its weights and its encoder's compute counted on the device "
                           "libmtmd runs it on (the first GPU where the model has layers there, else the CPU), and "
                           "shown")
    plan.add_argument("--json", action="store_true", help="print the placement as JSON")
    plan.add_argument("--fleet", action="store_true",
                      help="plan over the fleet's shard hosts too, as this box's serving would: serving.toml's "
                           "shard_hosts, their wire keys and its models_memory_mib where the options give none")
    plan.add_argument("--settings", metavar="FILE",
                      help="with --fleet: serving.toml (default: $EVERYCYCLE_STATE_DIR/serving.toml, "
                           "/etc/everycycle/serving.toml on the box)")
    _add_placement_options(plan)

    engine = sub.add_parser("engine", help="run only the inference engine, listening on a Unix socket")
    engine.add_argument("--socket", required=True, metavar="PATH", help="Unix socket to listen on")
    engine.add_argument("--options-stdin", action="store_true",
                        help="read every engine setting, the model's path too, from stdin as `serve` writes them "
                             "(engine/options.py) instead of these options")
    _add_engine_options(engine)

    discover = sub.add_parser("discover", help="enumerate the hardware and write the topology file",
                              description="Enumerate CPUs, memory, GPUs, PCIe, storage, network and BMC.")
    discover.add_argument("--output", metavar="PATH",
                          help="topology file (default: $EVERYCYCLE_RUN_DIR/discovery/topology.json, else /run/everycycle/...)")
    discover.add_argument("--print", action="store_true", help="print the topology instead of writing it")
    discover.add_argument("--format", choices=["json", "table"], default="json", help="with --print: json or a short table")
    discover.add_argument("--watch", action="store_true", help="keep running: rewrite the file when hardware or addresses change")
    discover.add_argument("--debounce", type=float, default=0.5, metavar="S", help="with --watch: settle time after events")
    discover.add_argument("--bmc-address", metavar="ADDR", help="a BMC the configuration names (IPMI over LAN)")

    governor = sub.add_parser("governor", help="the thermal-aware power governor")
    gov_sub = governor.add_subparsers(dest="governor_command", metavar="ACTION", required=True)
    sim = gov_sub.add_parser("simulate", help="try a power policy against simulated GPUs, faster than real time")
    sim.add_argument("--seconds", type=float, default=600.0, help="simulated time (default 600)")
    sim.add_argument("--ambient", type=float, default=25.0, metavar="C", help="inlet air temperature (default 25)")
    sim.add_argument("--inlet-step", metavar="C@T", help="raise the inlet by C degrees at T seconds, e.g. 10@300")
    sim.add_argument("--gpus", type=_positive, default=1, metavar="N")
    add_setting_flags(sim, ("target_c",), GovernorSettings)
    sim.add_argument("--json", action="store_true", help="print the whole summary as JSON")

    gov_run = gov_sub.add_parser("run", help="run the governor: read temperatures, decide limits, publish them")
    gov_run.add_argument("--settings", metavar="FILE",
                         help="governor.toml (written by provisioning from box.toml's [power]); options given "
                              "here win over it")
    add_setting_flags(gov_run, ("backend", "mode"), GovernorSettings)
    gov_run.add_argument("--state", metavar="PATH",
                         help="state file (default: $EVERYCYCLE_RUN_DIR/governor/governor.json); metrics go beside it as .prom")
    gov_run.add_argument("--tick", type=float, default=1.0, metavar="S", help="seconds between decisions (default 1)")
    add_setting_flags(gov_run, ("target_c",), GovernorSettings)
    gov_run.add_argument("--bmc-url", metavar="URL",
                         help="the BMC agent's /telemetry: a hot chassis inlet lowers every GPU's target")
    gov_run.add_argument("--sim-gpus", type=_positive, default=2, metavar="N", help="simulator: number of GPUs")
    gov_run.add_argument("--sim-ambient", type=float, default=25.0, metavar="C", help="simulator: inlet air")
    gov_run.add_argument("--sim-speed", type=float, default=1.0, metavar="X", help="simulator: simulated seconds per second")

    bmc = sub.add_parser("bmc", help="the BMC telemetry agent (IPMI, or hwmon where there is no BMC)",
                         description="Serve the box's BMC (or hwmon) telemetry as JSON and Prometheus text.")
    from agent_bmc.cli import add_arguments as add_bmc_arguments

    add_bmc_arguments(bmc)

    for name, help_text in (("console", "the dashboard (textual): what the box is doing, on one screen"),
                            ("status", "the dashboard's facts as plain text")):
        c = sub.add_parser(name, help=help_text)
        c.add_argument("--run-dir", metavar="DIR", help="where the services publish (default: $EVERYCYCLE_RUN_DIR or /run/everycycle)")
        c.add_argument("--serving-url", default="http://127.0.0.1:8080", metavar="URL")
        c.add_argument("--serving-socket", metavar="PATH",
                       help="read the API on its own Unix socket (as on the box) instead of --serving-url")
        c.add_argument("--front-settings", metavar="FILE",
                       help="the front's settings (front.toml): the URLs shown are its HTTPS ones")
        c.add_argument("--state-dir", metavar="DIR", help="where the front keeps its certificate and the box's local CA")
        c.add_argument("--new-keys-file", metavar="FILE",
                       help="API keys first boot made: shown once on the screen, then the file is removed")
        c.add_argument("--bmc-url", default="http://127.0.0.1:9290/telemetry", metavar="URL")
        c.add_argument("--keys", metavar="FILE", help="the API key file (only hints are ever shown)")
        c.add_argument("--provision-root", default="/", metavar="DIR", help="what the set-up wizard configures (default /)")
        c.add_argument("--bundle-dir", default="/efi/everycycle", metavar="DIR", help="where the wizard writes its bundle (default: the boot disk's EFI partition, /efi/everycycle)")
        if name == "console":
            c.add_argument("--tick", type=float, default=2.0, metavar="S", help="refresh period (default 2)")
            c.add_argument("--allow-quit", action="store_true", help="let q leave the console (to a login shell)")

    prov = sub.add_parser("provision", help="validate, sign and apply provisioning bundles")
    prov_sub = prov.add_subparsers(dest="provision_command", metavar="ACTION", required=True)
    pv = prov_sub.add_parser("validate", help="check a bundle (directory or tar) before flashing it")
    pa = prov_sub.add_parser("apply", help="apply a bundle: every part or none")
    ps = prov_sub.add_parser("sign", help="sign a bundle with an Ed25519 private key (PEM)")
    for p in (pv, pa, ps):
        p.add_argument("bundle", metavar="PATH")
    for p in (pv, pa):
        p.add_argument("--require-signature", metavar="PUBKEY", help="refuse bundles not signed by this key (PEM)")
    pa.add_argument("--root", default="/", metavar="DIR", help="the filesystem to configure (default /)")
    pa.add_argument("--trusted-key", metavar="PUBKEY",
                    help="where this key file exists (the image's, baked in by `make image BUNDLE_PUBKEY=`), "
                         "only bundles it signed are applied")
    pa.add_argument("--new-keys-file", metavar="FILE",
                    help="hand generated API keys to the console (it shows them once) in this 0600 file instead of "
                         "printing them: first boot's output reaches the journal and the serial console")
    pa.add_argument("--live-network", action="store_true", help="also configure static addresses and the hostname on the running system now")
    pa.add_argument("--wait-for-links", type=float, default=30.0, metavar="S",
                    help="with --live-network: how long a named interface may take to appear (default 30)")
    ps.add_argument("--key", required=True, metavar="PRIVKEY", help="Ed25519 private key, PEM")

    from host_runtime.measure.cli import add_parser as add_measure_parser
    from host_runtime.admin.models_cli import add_parser as add_models_parser
    from host_runtime.update.cli import add_parser as add_update_parser

    add_update_parser(sub)
    add_models_parser(sub)
    add_measure_parser(sub)

    keys = sub.add_parser("keys", help="manage API keys")
    keys_sub = keys.add_subparsers(dest="keys_command", metavar="ACTION", required=True)
    create = keys_sub.add_parser("create", help="create a key, print it once, store only its hash")
    create.add_argument("--keys", required=True, metavar="FILE", help="key file (created 0600 if missing)")
    create.add_argument("name", metavar="NAME", help="a label for the key, e.g. the client that will use it")
    create.add_argument("--priority", default="default", choices=["interactive", "default", "batch"],
                        help="its requests' class in the engine's queue: interactive ones may park batch ones' "
                             "sequences when every slot is busy (default: default)")
    limit = keys_sub.add_parser("set-limit", help="change a key's limits (those given; 0: no limit)")
    limit.add_argument("--keys", required=True, metavar="FILE", help="key file")
    limit.add_argument("name", metavar="NAME", help="the key's name")
    for p, default in ((create, 0), (limit, None)):
        p.add_argument("--max-concurrent", type=int, default=default, metavar="N",
                       help="its requests running or waiting at once, at most; past it a 429 (0: no limit)")
        p.add_argument("--tokens-per-minute", type=int, default=default, metavar="N",
                       help="its prompt and generated tokens in any minute, at most; past it a 429 with Retry-After "
                            "(0: no limit)")
        p.add_argument("--tokens-per-day", type=int, default=default, metavar="N",
                       help="the same in any 24 hours (0: no limit)")
        p.add_argument("--models", default=None, metavar="A,B,...",
                       help="the models (or aliases) it may ask for; others are a 403 ('': every model)")
        p.add_argument("--from", dest="allowed_from", default=None, metavar="ADDR,NET,...",
                       help="the client addresses or networks it is valid from; others are a 403 ('': any)")
        p.add_argument("--may-pull", choices=["yes", "no"], default=None,
                       help="whether it may change the box's models through the API (/api/pull): a model it "
                            "adds serves every key that names it; the owner's keys only (default: no)")
    usage = keys_sub.add_parser("usage", help="each key's requests and tokens, kept across restarts")
    usage.add_argument("--usage-dir", metavar="DIR", help="where serve keeps it (default: $EVERYCYCLE_USAGE_DIR, "
                                                        "else /var/lib/everycycle/usage)")
    usage.add_argument("--json", action="store_true", help="print JSON")
    prio = keys_sub.add_parser("set-priority", help="change a key's priority class (its clients keep their key)")
    prio.add_argument("--keys", required=True, metavar="FILE", help="key file")
    prio.add_argument("name", metavar="NAME", help="the key's name")
    prio.add_argument("priority", choices=["interactive", "default", "batch"], help="the class")
    revoke = keys_sub.add_parser("revoke", help="remove a key; clients using it get 401 from then on")
    revoke.add_argument("--keys", required=True, metavar="FILE", help="key file")
    revoke.add_argument("--missing-ok", action="store_true", help="succeed even if no key has that name")
    revoke.add_argument("name", metavar="NAME", help="the key's name")
    listing = keys_sub.add_parser("list", help="list key names and hints (never the keys)")
    listing.add_argument("--keys", required=True, metavar="FILE", help="key file")
    imported = keys_sub.add_parser("import", help="store the hash of a key made elsewhere (the fleet key, on each box)")
    imported.add_argument("--keys", required=True, metavar="FILE", help="key file (created 0600 if missing)")
    imported.add_argument("--key-file", required=True, metavar="FILE", help="a file holding the key (0600)")
    imported.add_argument("name", metavar="NAME", help="a label for the key, e.g. fleet")
    imported.add_argument("--gateway", action="store_true",
                          help="the fleet key on the fleet's gateway: keep the seed that vouches for clients' keys "
                               "to the boxes (their limits hold there); every box keeps the public half")

    fleet = sub.add_parser("fleet", help="several boxes behind one endpoint: the gateway (a router fed by every "
                                         "box's capability map)")
    fleet_sub = fleet.add_subparsers(dest="fleet_command", metavar="ACTION", required=True)
    gw = fleet_sub.add_parser("gateway", help="run the router and its controller in the foreground")
    gw.add_argument("--settings", metavar="FILE", help="fleet.toml (written by provisioning from box.toml's [fleet])")
    gw.add_argument("--peer", action="append", metavar="URL", help="a box's API base URL (repeatable; replaces "
                                                                    "the settings' peers)")
    gw.add_argument("--policy", help="the router's policy (cache_aware, round_robin, power_of_two, random)")
    gw.add_argument("--router-port", type=_port, help="the router's loopback port")
    gw.add_argument("--metrics-port", type=_port, help="the router's Prometheus port (loopback)")
    gw.add_argument("--poll-interval", type=_positive_float, metavar="S", help="seconds between capability polls")
    gw.add_argument("--key-file", metavar="FILE", help="the fleet key (0600)")
    gw.add_argument("--state", metavar="FILE", help="write what the gateway sees and did here, each poll (JSON)")
    gw.add_argument("--if-gateway", action="store_true",
                    help="only when --settings says role = \"gateway\"; otherwise wait idle (supervisord's program)")
    gw.add_argument("--vocab-dir", metavar="DIR", help="where o200k_base.tiktoken is (default: under the venv)")
    gw.add_argument("--front-settings", metavar="FILE",
                    help="front.toml: the HTTPS port (and listen address) a member announces by mDNS")
    address = fleet_sub.add_parser("address", help="hold the fleet's virtual address with the other gateway "
                                                   "(keepalived's VRRP, fleet.toml's virtual_address); idle "
                                                   "where none is set")
    address.add_argument("--settings", metavar="FILE", help="fleet.toml")
    address.add_argument("--front-settings", metavar="FILE", help="front.toml: the HTTPS port the check connects to")
    address.add_argument("--run-dir", required=True, metavar="DIR", help="where keepalived's configuration goes")
    upd = fleet_sub.add_parser("update", help="update the members one at a time (SSH as root: `everycycle update "
                                              "apply --reboot` on each), each back and blessed before the next")
    upd.add_argument("--from", dest="source", required=True, metavar="URL",
                     help="the release's http(s) URL on the LAN, as each member's `update apply --from` takes it")
    upd.add_argument("--ssh-key", required=True, metavar="FILE", help="the private key the members' bundles "
                                                                     "authorize for root ([ssh] authorized_keys)")
    upd.add_argument("--settings", metavar="FILE", help="fleet.toml: the members (peers), the fleet key, the peer "
                                                       "certificates")
    upd.add_argument("--box", action="append", metavar="URL", help="a member to update, in order (repeatable; "
                                                                   "default: fleet.toml's peers but this box)")
    upd.add_argument("--target", metavar="VERSION", help="the release's version (default: read from --from and "
                                                        "verified with this box's update key)")
    upd.add_argument("--known-hosts", metavar="FILE", help="ssh's known_hosts (default ~/.ssh/known_hosts; a new "
                                                          "member's host key is remembered the first time)")
    upd.add_argument("--timeout", type=_positive_float, default=1800.0, metavar="S",
                     help="how long a box has to come back blessed on the new version (default 1800)")
    upd.add_argument("--interval", type=_positive_float, default=5.0, metavar="S", help="seconds between polls")
    lend = fleet_sub.add_parser("shard-host", help="lend this box's devices (its GPUs, else its CPU) to a model "
                                                   "another box of the fleet holds (its serve --shard-host)")
    lend.add_argument("--listen", type=_host_port, metavar="ADDR:PORT",
                      help="where the holder reaches this box (TLS keyed from the fleet key; nothing else gets in; "
                           "default: --settings' shard_listen)")
    lend_key = lend.add_mutually_exclusive_group()
    lend_key.add_argument("--key-file", metavar="FILE", help="the fleet key's file (0600)")
    lend_key.add_argument("--wire-key-file", metavar="FILE",
                          help="this member's own wire key (0600), from `everycycle fleet shard-key` on a box with the "
                               "fleet key: a member then holds nothing that opens another box (default: --settings' "
                               "shard_wire_key_file)")
    lend.add_argument("--settings", metavar="FILE",
                      help="fleet.toml: its shard_listen, shard_lend_mib and shard_wire_key_file where the options "
                           "give none (provisioning writes them from box.toml's [fleet])")
    lend.add_argument("--if-lending", action="store_true",
                      help="where --settings names no shard_listen, wait for a stop and lend nothing (supervisord "
                           "runs the program on every box)")
    lend.add_argument("--cache-dir", metavar="DIR",
                      help="keep the weights sent here by hash, so that a reload sends only hashes (default: none)")
    lend.add_argument("--threads", type=_positive, metavar="N", help="CPU threads for the lent CPU (default: all)")
    lend.add_argument("--lend-mib", type=_positive, metavar="MIB",
                      help="the most any device lends (default: a GPU its free memory, the CPU the RAM available; "
                           "each less the larger of 5%% and 512 MiB for a GPU, 1 GiB for the CPU)")
    shard_key = fleet_sub.add_parser("shard-key", help="print a member's own wire key (for its shard-host "
                                                       "--wire-key-file), or a holder's for its members (for its "
                                                       "--shard-key-file), derived from the fleet key and each "
                                                       "member's address")
    shard_key.add_argument("--member", required=True, action="append", type=_host_port, metavar="ADDR:PORT",
                           help="a member's shard-host --listen (repeatable: a holder's file, a line for each)")
    shard_key.add_argument("--key-file", required=True, metavar="FILE", help="the fleet key's file (0600)")
    status = fleet_sub.add_parser("status", help="each box as the gateway's last poll saw it: version, slot, "
                                                 "serving or why not, models")
    status.add_argument("--state", metavar="FILE", help="the gateway's state file (default: RUN_DIR/fleet/fleet.json)")
    status.add_argument("--run-dir", metavar="DIR", help="where the services publish (default: $EVERYCYCLE_RUN_DIR "
                                                         "or /run/everycycle)")
    status.add_argument("--json", action="store_true", help="the state as JSON")
    peers = fleet_sub.add_parser("peers", help="the boxes the gateway would poll: fleet.toml's peers and, with "
                                               "mdns = true, the fronts announced on the LAN")
    peers.add_argument("--settings", metavar="FILE", help="fleet.toml")
    peers.add_argument("--wait", type=_positive_float, default=3.0, metavar="S",
                       help="how long to listen for announcements (default 3)")
    peers.add_argument("--json", action="store_true", help="one JSON document")
    return parser
