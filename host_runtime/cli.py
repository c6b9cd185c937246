"""`everycycle`: one entry point, a subcommand per service of the box."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
from pathlib import Path

from host_runtime import __version__
from host_runtime.common import run_layout
from host_runtime.common.errors import EveryCycleError, InputError, UnavailableError
from host_runtime.engine.limits import DEFAULT_CTX


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port must be 0-65535, got {value}")
    return value


def _host_port(text: str) -> str:
    from host_runtime.common.host_port import split_host_port

    try:
        split_host_port(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _int_at_least(low: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
        return value

    return parse


_positive = _int_at_least(1)
_non_negative = _int_at_least(0)


def _keep_alive(text: str) -> float | None:
    from host_runtime.pool.residency import parse_keep_alive

    try:
        return parse_keep_alive(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None


def _positive_float(text: str) -> float:
    value = _number(text)
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be more than 0, got {text}")
    return value


def _draft_max(text: str) -> int:
    value = _positive(text)
    if value > 15:  # a step holds 16 decode tokens: the pending one and up to 15 drafted
        raise argparse.ArgumentTypeError(f"must be at most 15, got {value}")
    return value


def _probability_below_one(text: str) -> float:
    value = _number(text)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 0 and below 1, got {text}")
    return value


def _run_dir(explicit: str | None = None) -> Path:
    """Where the services publish (common/run_layout.py)."""
    return run_layout.run_dir(explicit)


DEFAULT_KV_BUDGET_MIB = 1024
DEFAULT_CACHE_TYPE = "f16"
DEFAULT_KEEP_ALIVE_S = 300.0
_UNSET = object()  # an option's default where None is a value (--keep-alive -1: forever)


def _add_cache_types(p: argparse.ArgumentParser) -> None:
    from host_runtime.placement.kv_types import KV_TYPES

    for which in ("k", "v"):
        p.add_argument(f"--cache-type-{which}", choices=list(KV_TYPES), metavar="TYPE",
                       help=f"the KV cache's {which.upper()} type, as llama-server names them ({', '.join(KV_TYPES)}; "
                            f"default {DEFAULT_CACHE_TYPE}); a quantized one turns flash attention on")


def _add_engine_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", metavar="PATH", help="GGUF model file (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--threads", type=_non_negative, default=0, metavar="N", help="CPU threads for llama.cpp (0: all cores)")
    p.add_argument("--decode-threads", type=_non_negative, default=0, metavar="N",
                   help="CPU threads for a decode call of one token, a lone stream's step (0: as --threads)")
    p.add_argument("--ctx-size", type=_positive, metavar="N",
                   help="context tokens per sequence, at most the model's trained context (default: the trained "
                        f"context, up to {DEFAULT_CTX})")
    p.add_argument("--parallel", type=_positive, metavar="N",
                   help="sequences decoded together (default: as many as --kv-budget-mib holds at full context, up to 16)")
    p.add_argument("--kv-budget-mib", type=_positive, metavar="MIB",
                   help=f"memory for the KV cache of running sequences (default {DEFAULT_KV_BUDGET_MIB})")
    _add_cache_types(p)
    p.add_argument("--max-queue", type=_non_negative, metavar="N",
                   help="requests allowed to wait for a sequence before new ones get 503 (default 4 per sequence)")
    p.add_argument("--prefix-cache-ram-mib", type=_non_negative, default=1024, metavar="MIB",
                   help="host RAM for cached prompt prefixes moved out of the context (default 1024)")
    p.add_argument("--prefix-cache-disk-mib", type=_non_negative, default=4096, metavar="MIB",
                   help="disk space for cached prompt prefixes moved out of RAM (default 4096)")
    p.add_argument("--prefix-cache-dir", metavar="DIR",
                   help="where the disk tier lives (serve: RUN_DIR/prefix-cache; engine: no disk tier without it)")
    p.add_argument("--no-prefix-cache", action="store_true", help="recompute every prompt from scratch")
    p.add_argument("--mixed-batches", action="store_true",
                   help="prompt chunks and decode tokens in one llama_decode call over one shared KV buffer, as "
                        "llama-server batches; a request's output then depends on what else is batched (default: "
                        "batch-invariant, the faster of the two on CPU as measured by bench/serving.py)")
    p.add_argument("--speculation", choices=["ngram", "draft", "off"],
                   help="ngram: each decoding sequence drafts the tokens that followed the latest earlier occurrence "
                        "of its last few tokens (prompt lookup) and the model verifies them in the same call, so "
                        "edits and quotes come several tokens a step; drafts stop when a step holds 16 tokens or the "
                        "measured cost of calls says they would not pay (--draft-always). The "
                        "output is the one decoding without it gives (on the CPU in the default batching mode, "
                        "which then lays attention out for it: README). draft: a smaller model of the "
                        "same vocabulary (--draft-model) drafts its most likely tokens. off (default): one token a "
                        "step")
    p.add_argument("--draft-max", type=_draft_max, default=12, metavar="N",
                   help="the most tokens a sequence drafts in a step, 1 to 15; up to this, each sequence drafts "
                        "as many as its acceptance and the measured cost of calls say pay (default 12)")
    p.add_argument("--draft-always", action="store_true",
                   help="draft as much as acceptance earned and the step has room for, whatever the calls cost "
                        "(default: only as much as the measured cost of this box's decode calls says pays; on a "
                        "small CPU bound by computation that is often nothing)")
    p.add_argument("--draft-p-min", type=_probability_below_one, default=0.0, metavar="P",
                   help="with --speculation draft: the draft stops at a token the draft model gives less than P "
                        "(a likely rejection; default 0: never, as llama.cpp's default)")
    p.add_argument("--draft-model", metavar="PATH",
                   help="with --speculation draft: the GGUF that drafts for the served model (models loaded on "
                        "demand beside it run without); its tokens must be the target's (loaded after the target, "
                        "placed by the same planner, with as many sequences)")
    p.add_argument("--wedge-floor", type=_positive_float, default=30.0, metavar="S",
                   help="the engine counts as wedged when pending work sees no decode call complete for the larger "
                        "of this and 10x its expected call time, measured (default 30)")
    p.add_argument("--governor-state", metavar="PATH",
                   help="the power governor's state file: its throttle level lowers concurrency (default: none)")
    _add_placement_options(p)


def _tensor_split(text: str) -> str:
    """'3,1' (as llama-server takes it): checked here, kept as text so it passes to the engine unchanged."""
    try:
        values = [float(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers such as 3,1, got {text!r}") from None
    if any(v < 0 for v in values) or sum(values) <= 0:
        raise argparse.ArgumentTypeError(f"values must be non-negative with a positive sum, got {text!r}")
    return text


def _add_placement_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--placement", choices=["auto", "cpu"], default="auto",
                   help="auto (default): the planner spreads layers over the GPUs llama.cpp sees, proven to fit "
                        "before loading; cpu: keep everything on the CPU")
    p.add_argument("--gpu-layers", type=_non_negative, metavar="N",
                   help="offload exactly N layers (the output layer counts first), as llama-server's -ngl; "
                        "checked by the same proof")
    p.add_argument("--tensor-split", type=_tensor_split, metavar="A,B,...",
                   help="share of the offloaded layers per GPU, in llama.cpp's device order (as llama-server)")
    p.add_argument("--main-gpu", type=_non_negative, metavar="I",
                   help="use only GPU I (llama.cpp's device order), as llama-server's --split-mode none --main-gpu I")
    moe = p.add_mutually_exclusive_group()
    moe.add_argument("--cpu-moe", action="store_true",
                     help="a mixture-of-experts model keeps every layer's expert weights in host RAM, as llama-server's "
                          "--cpu-moe (default: the planner keeps as few there as let every layer's attention onto "
                          "the GPUs, and none where whole layers fit)")
    moe.add_argument("--n-cpu-moe", type=_non_negative, metavar="N",
                     help="keep the expert weights of the first N layers in host RAM, as llama-server's --n-cpu-moe")
    p.add_argument("--gpu-margin-mib", type=_non_negative, default=512, metavar="MIB",
                   help="memory each GPU keeps free: the larger of this and 5%% of the card (default 512)")


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
    serve.add_argument("--keys", metavar="FILE", help="API key file (from 'everycycle keys create'); without it the API is open")
    serve.add_argument("--prefix-cache-shared", action="store_true",
                       help="let every API key's requests reuse each other's cached prompt prefixes (default: each key "
                            "finds only its own, so a hit tells no key about another's prompts; serving.toml's "
                            "prefix_cache_shared)")
    serve.add_argument("--workers", type=_positive, default=2, metavar="N", help="HTTP worker processes (default 2)")
    serve.add_argument("--http-threads", type=_positive, metavar="N",
                       help="threads per HTTP worker (default: every request the engine admits, running or queued, "
                            "plus 16 for health and metrics; at least 32)")
    serve.add_argument("--max-body-bytes", type=_positive, default=1 << 20, metavar="N", help="request body limit (default 1 MiB)")
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
    serve.add_argument("--keep-alive", type=_keep_alive, default=_UNSET, metavar="DURATION",
                       help="how long a model loaded on demand stays after its last request (default 5m; -1: "
                            "forever; a request's keep_alive wins)")
    serve.add_argument("--models-memory-mib", type=_positive, metavar="MIB",
                       help="memory for loaded models, the one served at start included (default: 90%% of what is "
                            "available at start)")
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
    plan.add_argument("--ctx-size", type=_positive, default=DEFAULT_CTX, metavar="N",
                      help=f"context tokens per sequence, at most the model's trained context (default: the trained "
                           f"context, up to {DEFAULT_CTX})")
    plan.add_argument("--parallel", type=_positive, metavar="N",
                      help="sequences decoded together (default: as many as --kv-budget-mib holds, up to 16)")
    plan.add_argument("--kv-budget-mib", type=_positive, default=1024, metavar="MIB",
                      help="memory for the KV cache of running sequences (default 1024)")
    plan.add_argument("--batch", type=_positive, default=512, metavar="N", help="prompt tokens per step (default 512)")
    _add_cache_types(plan)
    plan.add_argument("--topology", metavar="FILE",
                      help="plan for the devices in this topology file (from 'everycycle discover') instead of the "
                           "live ones; such a plan is not proven, as llama.cpp can only size devices it has")
    plan.add_argument("--json", action="store_true", help="print the placement as JSON")
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
    sim.add_argument("--target", type=float, default=75.0, metavar="C", help="target temperature (default 75)")
    sim.add_argument("--json", action="store_true", help="print the whole summary as JSON")

    gov_run = gov_sub.add_parser("run", help="run the governor: read temperatures, decide limits, publish them")
    gov_run.add_argument("--settings", metavar="FILE",
                         help="governor.toml (written by provisioning from box.toml's [power]); options given "
                              "here win over it")
    gov_run.add_argument("--backend", choices=["auto", "nvml", "amdgpu", "simulator"],
                         help="where temperatures come from and limits go (auto: nvml, else amdgpu, else no GPU "
                              "to govern; simulator: simulated GPUs, for demos and tests; default: --settings', "
                              "else auto)")
    gov_run.add_argument("--mode", choices=["observe", "enforce"],
                         help="observe: decide and publish, never change a card (the default for real GPUs); "
                              "enforce: apply the limits (the default for the simulator)")
    gov_run.add_argument("--state", metavar="PATH",
                         help="state file (default: $EVERYCYCLE_RUN_DIR/governor/governor.json); metrics go beside it as .prom")
    gov_run.add_argument("--tick", type=float, default=1.0, metavar="S", help="seconds between decisions (default 1)")
    gov_run.add_argument("--target", type=float, metavar="C", help="target temperature (default: --settings', else 75)")
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


def _resolve_model(parser: argparse.ArgumentParser, model: str | None) -> str:
    from host_runtime.engine.model import ModelLoadError, check_gguf_file, default_model_path

    try:
        path = Path(model) if model else default_model_path()
        return str(check_gguf_file(path).resolve())
    except ModelLoadError as exc:
        parser.error(f"--model: {exc}")


def _resolve_draft_model(parser: argparse.ArgumentParser, args) -> str | None:
    """--draft-model goes with --speculation draft, each needing the other; the path is checked as --model's."""
    from host_runtime.engine.model import ModelLoadError, check_gguf_file

    if args.speculation == "draft" and not args.draft_model:
        parser.error("--speculation draft: needs --draft-model PATH, the GGUF that drafts")
    if args.draft_model and args.speculation != "draft":
        parser.error("--draft-model: drafts only with --speculation draft")
    if args.draft_p_min and args.speculation != "draft":
        parser.error("--draft-p-min: applies only to --speculation draft (a draft model's probabilities)")
    if not args.draft_model:
        return None
    try:
        return str(check_gguf_file(args.draft_model).resolve())
    except ModelLoadError as exc:
        parser.error(f"--draft-model: {exc}")


def _setup_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)


def _refuse_an_unsupported_cpu(parser) -> None:
    """Before llama.cpp is loaded: an image's portable build on too old a CPU would die of SIGILL."""
    from host_runtime.engine.cpu_support import check_this_machine

    reason = check_this_machine()
    if reason:
        parser.error(reason)


def _refuse_offload_with_cpu_placement(parser, args) -> None:
    if args.placement == "cpu" and (args.gpu_layers or args.tensor_split or args.main_gpu is not None):
        parser.error("--placement cpu: cannot be combined with --gpu-layers, --tensor-split or --main-gpu")


def _check_offload_flags(parser, args) -> None:
    """Explicit offload flags the installed llama.cpp cannot honour stop the start, naming the flag."""
    _refuse_offload_with_cpu_placement(parser, args)
    if args.main_gpu is not None and args.tensor_split:
        parser.error("--main-gpu: puts the model on one GPU, so --tensor-split has nothing to split")
    if not (args.gpu_layers or args.tensor_split or args.main_gpu is not None):
        return
    from host_runtime.gpu.llama_devices import LlamaDevicesError, compiled_backends, list_devices

    flag = "--gpu-layers" if args.gpu_layers else "--tensor-split" if args.tensor_split else "--main-gpu"
    try:
        backends, devices = compiled_backends(), list_devices()
    except LlamaDevicesError as exc:
        parser.error(f"{flag}: {exc}")
    gpu_backends = [b for b in backends if b not in ("CPU", "BLAS", "RPC")]
    if not gpu_backends:
        parser.error(f"{flag}: this llama.cpp build has no GPU backend (built with: {', '.join(backends)}); "
                     "rebuild it with Vulkan or CUDA (make install), or drop the flag")
    if not devices:
        parser.error(f"{flag}: the {'/'.join(gpu_backends)} backend finds no GPU on this machine")
    if args.main_gpu is not None and args.main_gpu >= len(devices):
        parser.error(f"--main-gpu {args.main_gpu}: this machine has {len(devices)} GPU(s) "
                     f"({', '.join(d.name for d in devices)}), numbered from 0")
    split = _split_values(args.tensor_split)
    if split and len(split) > len(devices):
        parser.error(f"--tensor-split: {len(split)} values for {len(devices)} GPU(s) "
                     f"({', '.join(d.name for d in devices)})")


def cmd_serve(parser, args) -> int:
    from host_runtime.auth.keystore import KeyStoreError, check_permissions, load_keys
    from host_runtime.common.settings_file import SettingsError
    from host_runtime.common.settings_file import load as load_settings
    from host_runtime.serving.app import AppConfig
    from host_runtime.pool.engine_child import EngineChild
    from host_runtime.serving.gunicorn_runner import ServingApplication
    from host_runtime.serving.settings import ServingSettings

    try:
        settings = load_settings(ServingSettings, args.settings)
    except SettingsError as exc:
        parser.error(f"--settings: {exc}")
    if args.trace_endpoint:
        from host_runtime.serving.settings import check_trace_endpoint

        try:
            check_trace_endpoint(args.trace_endpoint, "--trace-endpoint")
        except SettingsError as exc:
            parser.error(str(exc))
    model_arg = args.model or settings.model or _pulled_model(args, settings) or None
    args = serve_arguments(args, settings, _own_settings(parser, args, model_arg))

    if args.engine_socket is None:
        _refuse_an_unsupported_cpu(parser)
    if args.keys:
        try:
            if not os.path.exists(args.keys):
                parser.error(f"--keys: {args.keys} does not exist (create one: everycycle keys create --keys {args.keys} NAME)")
            check_permissions(args.keys)
            load_keys(args.keys)
        except KeyStoreError as exc:
            parser.error(f"--keys: {exc}")
    engine = pool = None
    socket_path = args.engine_socket
    if socket_path is None:
        run_dir = Path(args.run_dir) if args.run_dir else Path(tempfile.mkdtemp(prefix="everycycle-"))
        options = engine_options(parser, argparse.Namespace(**{
            **vars(args), "prefix_cache_dir": args.prefix_cache_dir or str(run_dir / "prefix-cache")}), model_arg)
        run_dir.mkdir(parents=True, exist_ok=True)
        socket_path = str(run_dir / "engine.sock")
        engine = EngineChild(socket_path, options, wedged_after_s=args.wedge_floor)
        pool = _engine_pool(run_dir, socket_path, options, engine, args)
        if settings.pull_url and pool.default_name != settings.pulled_name:
            from host_runtime.models.provisioned import ProvisionedPull

            pool.provisioned = ProvisionedPull(pool.store, settings.pulled_name, settings.pull_url,
                                               settings.pull_sha256, on_pulled=pool.load_pulled)
    elif model_arg:
        parser.error("--model: not used with --engine-socket (the running engine has its model)")
    metrics_access = args.metrics_access
    if metrics_access is None:
        from host_runtime.front import settings as front_settings

        try:
            metrics_access = front_settings.load(args.front_settings).metrics
        except front_settings.SettingsError as exc:
            parser.error(f"--front-settings: {exc}")
    config = AppConfig(engine_socket=socket_path, keys_file=args.keys, max_body_bytes=args.max_body_bytes,
                       ready_wait_s=args.ready_wait, wedge_floor_s=args.wedge_floor, metrics_access=metrics_access,
                       governor_state=args.governor_state, pool_socket=pool.control_socket if pool else None,
                       fleet_router=args.fleet_router or settings.fleet_router or None,
                       prefix_cache_shared=args.prefix_cache_shared or settings.prefix_cache_shared,
                       aliases=tuple(settings.aliases.items()),
                       model_store=str(pool.store.root) if pool else None,
                       pull_hosts=tuple(settings.pull_hosts),
                       trace_endpoint=args.trace_endpoint or settings.trace_endpoint or None,
                       trace_sample_ratio=settings.trace_sample_ratio)
    if not args.keys:
        logging.getLogger("everycycle.serve").warning("no --keys file: the API accepts requests without a key")
    bind = [f"unix:{args.unix_socket}" if args.unix_socket else f"{args.host}:{args.port}"]
    also = args.also_listen or settings.fleet_listen
    bind += [also] if also else []
    if args.unix_socket:
        # Only the front and root (the console) reach the API's socket: the box's own readers get /metrics there
        # without a key. The image gives its directory the front's group (everycycle-api, tmpfiles.d), which
        # may pass; a directory of the serving user's own group (make run, the tests) is the user's alone.
        sock_dir = Path(args.unix_socket).parent
        sock_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(sock_dir, 0o750 if sock_dir.stat().st_gid != os.getegid() else 0o700)
    threads = args.http_threads
    if threads is None:
        from host_runtime.serving.http_threads import http_threads

        threads = http_threads(args.parallel, args.max_queue)
    app = ServingApplication(config, bind=bind, workers=args.workers, threads=threads, engine=engine, pool=pool)
    try:
        app.run()
    except SystemExit:  # gunicorn's master ends by sys.exit, 0 after a SIGTERM: the engine's fate decides
        if not app.engine_gave_up:
            raise
    return 1 if app.engine_gave_up else 0


def serve_arguments(args, settings, own: dict | None = None):
    """serve's options with, where the command line gave none (explicit options win), the served model's own
    settings (`own`: models/model_settings.py), then serving.toml's, then the defaults: what the serve process
    runs with, from box.toml's [model] and [serving] without an argv. `explicit` names the options given."""
    resolved = argparse.Namespace(**vars(args))
    resolved.explicit = frozenset(name for name in ("ctx_size", "parallel", "kv_budget_mib", "speculation",
                                                    "cache_type_k", "cache_type_v") if getattr(args, name) is not None)
    own = own or {}
    for name, value, default in (("ctx_size", settings.context_length, DEFAULT_CTX),
                                 ("parallel", settings.parallel, None),
                                 ("kv_budget_mib", settings.kv_budget_mib, DEFAULT_KV_BUDGET_MIB),
                                 ("models_memory_mib", settings.models_memory_mib, None),
                                 ("speculation", settings.speculation, "off"),
                                 ("cache_type_k", settings.cache_type_k, DEFAULT_CACHE_TYPE),
                                 ("cache_type_v", settings.cache_type_v, DEFAULT_CACHE_TYPE)):
        if getattr(args, name) is None:
            setattr(resolved, name, own.get(name) or value or default)
    resolved.usage_dir = args.usage_dir or settings.usage_dir or None
    if args.keep_alive is _UNSET:  # None is forever
        resolved.keep_alive = settings.keep_alive_s if settings.keep_alive else DEFAULT_KEEP_ALIVE_S
    return resolved


def _own_settings(parser, args, model: str | None) -> dict:
    """The settings a store model keeps for itself (models set), by serve option; none for a file outside it."""
    from host_runtime.models.errors import StoreError

    try:
        return _model_store(args).own_serve_options(model) if model else {}
    except StoreError as exc:
        parser.error(f"the model's own settings: {exc}")


def _model_store(args):
    from host_runtime.models.store import Store

    return Store(Path(args.model_store)) if args.model_store else Store()


def _pulled_model(args, settings) -> str | None:
    """The bundle's pulled model, once the store holds it (until then the built-in one is served)."""
    if not settings.pull_url:
        return None
    from host_runtime.models.provisioned import pulled_path

    path = pulled_path(_model_store(args), settings.pulled_name, settings.pull_sha256)
    return str(path) if path else None


def _engine_pool(run_dir: Path, socket_path: str, options, engine, args):
    """The other models of the store, loaded on demand beside the one this server starts with (`options`' model),
    each with `options` changed where that model needs it (EngineOptions.for_on_demand)."""
    import psutil

    from host_runtime.engine.model import model_id_for
    from host_runtime.pool.pool import EnginePool

    budget = (args.models_memory_mib << 20) if args.models_memory_mib else int(psutil.virtual_memory().available * 0.9)

    # Each on-demand engine also keeps a prefix cache's RAM tier of its own (up to --prefix-cache-ram-mib): counted
    # in what it takes, so that the models' memory budget holds with their caches full.
    cache = options.prefix_cache
    cache_ram = cache.ram_bytes if cache.enabled else 0

    store = _model_store(args)

    def options_for(path: str):
        """`options` for another model: changed where it needs (for_on_demand), then by its own settings (models
        set), save those the command line gave."""
        from host_runtime.models.errors import StoreError

        on_demand = options.for_on_demand(path)
        try:
            own = store.own_serve_options(path)
        except StoreError as exc:
            logging.getLogger("everycycle.serve").warning("%s: loaded with box.toml's settings", exc)
            own = {}
        own = {option: value for option, value in own.items() if option not in getattr(args, "explicit", ())}
        return on_demand.with_serving(**own) if own else on_demand

    def need_for(path: str) -> int:
        from host_runtime.placement.session import resident_bytes_for

        return resident_bytes_for(path, options_for(path).context) + cache_ram
    return EnginePool(run_dir=run_dir, default_name=model_id_for(options.model), default_path=options.model,
                      default_socket=socket_path, default_child=engine, engine_options=options_for,
                      store=store, budget_bytes=budget, need_for=need_for, keep_alive_s=args.keep_alive)


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


def engine_options(parser, args, model: str | None):
    """The engine's settings from `serve`'s or `engine`'s options (checked first, the model last), as one
    EngineOptions."""
    from host_runtime.engine.model import ContextConfig, model_id_for
    from host_runtime.engine.options import EngineOptions, PrefixCacheConfig
    from host_runtime.engine.readiness import WedgePolicy
    from host_runtime.engine.speculation import SpeculationConfig

    _check_offload_flags(parser, args)
    speculating = args.speculation not in (None, "off")
    context = ContextConfig(n_ctx_per_seq=args.ctx_size or DEFAULT_CTX, n_parallel=args.parallel,
                            n_threads=args.threads, n_threads_decode=args.decode_threads,
                            kv_budget_bytes=(args.kv_budget_mib or DEFAULT_KV_BUDGET_MIB) << 20,
                            max_waiting=args.max_queue,
                            placement=args.placement, n_gpu_layers=args.gpu_layers,
                            tensor_split=_split_values(args.tensor_split), gpu_margin_bytes=args.gpu_margin_mib << 20,
                            main_gpu=args.main_gpu, batch_invariant=not args.mixed_batches, speculation=speculating,
                            cache_type_k=args.cache_type_k or DEFAULT_CACHE_TYPE,
                            cache_type_v=args.cache_type_v or DEFAULT_CACHE_TYPE, n_cpu_moe=_n_cpu_moe(args))
    cache = PrefixCacheConfig(enabled=not args.no_prefix_cache, ram_bytes=args.prefix_cache_ram_mib << 20,
                              disk_bytes=args.prefix_cache_disk_mib << 20, directory=args.prefix_cache_dir)
    speculation = SpeculationConfig(enabled=speculating, kind="ngram" if not speculating else args.speculation,
                                    k_max=args.draft_max, cost_aware=not args.draft_always, p_min=args.draft_p_min)
    draft_model = _resolve_draft_model(parser, args)
    model_path = _resolve_model(parser, model)
    usage_dir = getattr(args, "usage_dir", None)  # serve's (engine runs without)
    return EngineOptions(model=model_path, context=context, prefix_cache=cache,
                         speculation=speculation, draft_model=draft_model, governor_state=args.governor_state,
                         wedge=WedgePolicy(floor_s=args.wedge_floor),
                         usage_file=os.path.join(usage_dir, f"{model_id_for(model_path)}.json") if usage_dir else None)


def cmd_engine(parser, args) -> int:
    _refuse_an_unsupported_cpu(parser)
    from host_runtime.engine.options import EngineOptions, OptionsError
    from host_runtime.engine.service import EngineService, serve_engine

    if args.options_stdin:
        try:
            options = EngineOptions.from_json(sys.stdin.buffer.read())
        except OptionsError as exc:
            parser.error(f"--options-stdin: {exc}")
    else:
        options = engine_options(parser, args, args.model)
    service = EngineService(options)
    serve_engine(args.socket, service)
    return 0 if service.state != "failed" else 1


def _n_cpu_moe(args) -> int | None:
    """--cpu-moe is every layer: a count past any model's layers, which the planner clips to the model's."""
    return 1 << 16 if args.cpu_moe else args.n_cpu_moe


def _split_values(text: str | None) -> tuple[float, ...] | None:
    return tuple(float(x) for x in text.split(",")) if text else None


def cmd_plan(parser, args) -> int:
    import json

    from host_runtime.placement.render import render_table
    from host_runtime.engine.model import ContextConfig
    from host_runtime.placement.session import PlanInputsError, plan_for_cli

    _refuse_offload_with_cpu_placement(parser, args)
    model = _resolve_model(parser, args.model)
    try:
        outcome = plan_for_cli(model, ContextConfig(
            n_ctx_per_seq=args.ctx_size, n_parallel=args.parallel, kv_budget_bytes=args.kv_budget_mib << 20,
            placement=args.placement, n_gpu_layers=args.gpu_layers, tensor_split=_split_values(args.tensor_split),
            gpu_margin_bytes=args.gpu_margin_mib << 20, main_gpu=args.main_gpu,
            cache_type_k=args.cache_type_k or DEFAULT_CACHE_TYPE, cache_type_v=args.cache_type_v or DEFAULT_CACHE_TYPE,
            n_cpu_moe=_n_cpu_moe(args)),
            n_batch=args.batch,
            topology=args.topology)
    except PlanInputsError as exc:
        print(f"everycycle plan: {exc}", file=sys.stderr)
        return 2
    if outcome.error:
        if args.json:
            print(json.dumps({"fits": False, "reason": outcome.error, "proven": outcome.proven}, indent=2))
        print(f"everycycle plan: {outcome.error}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"fits": True, "proven": outcome.proven, "proof": outcome.proof_note,
                          **outcome.placement.to_json()}, indent=2))
    else:
        print(render_table(outcome.placement, proven=outcome.proven, proof_note=outcome.proof_note))
    return 0


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
                           gpus=args.gpus), PowerPolicy(target_c=args.target))
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

    from host_runtime.box_status.reader import ConsoleConfig, StatusReader
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
    config = ConsoleConfig(run_dir=run_dir, serving_url=args.serving_url.rstrip("/"), bmc_url=args.bmc_url,
                           serving_socket=Path(args.serving_socket) if args.serving_socket else None,
                           keys_file=Path(args.keys) if args.keys else None,
                           api_port=api_port, api_scheme=api_scheme, api_listen=api_listen, tls_certificate=certificate,
                           tls_anchor=anchor, lan_name=lan_name,
                           provision_root=Path(args.provision_root), bundle_dir=Path(args.bundle_dir),
                           new_keys_file=Path(args.new_keys_file) if args.new_keys_file else None,
                           model_store=default_store_root(),
                           serving_settings=Path(args.state_dir or os.environ.get("EVERYCYCLE_STATE_DIR",
                                                                                  "/etc/everycycle")) / "serving.toml")
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


def cmd_keys(parser, args) -> int:
    from host_runtime.auth.keystore import KeyStoreError, create_key, load_keys, revoke_key

    try:
        if args.keys_command == "create":
            limits = _key_limits(args)
            key = create_key(args.keys, args.name, args.priority)
            if any(v for v in limits.values()):
                from host_runtime.auth.keystore import set_limit

                set_limit(args.keys, args.name, **limits)
            print(key)
            print(f"stored the hash of key {args.name!r} in {args.keys}; this is the only time the key is shown",
                  file=sys.stderr)
        elif args.keys_command == "set-limit":
            from host_runtime.auth.keystore import set_limit

            set_limit(args.keys, args.name, **_key_limits(args))
            policy = next(k for k in load_keys(args.keys) if k.name == args.name)
            print(f"key {args.name!r}: {_limits_text(policy)}", file=sys.stderr)
        elif args.keys_command == "set-priority":
            from host_runtime.auth.keystore import set_priority

            set_priority(args.keys, args.name, args.priority)
            print(f"key {args.name!r} is now of class {args.priority}", file=sys.stderr)
        elif args.keys_command == "revoke":
            if not revoke_key(args.keys, args.name) and not args.missing_ok:
                print(f"everycycle keys: no key named {args.name!r} in {args.keys}", file=sys.stderr)
                return 2
        elif args.keys_command == "import":
            from host_runtime.auth.keystore import store_key
            from host_runtime.common.settings_file import SettingsError
            from host_runtime.fleet.settings import read_key

            try:
                key = read_key(args.key_file)
            except SettingsError as exc:
                print(f"everycycle keys: --key-file: {exc.message}", file=sys.stderr)
                return 2
            store_key(args.keys, args.name, key)
            print(f"stored the hash of key {args.name!r} in {args.keys}", file=sys.stderr)
        elif args.keys_command == "usage":
            return _keys_usage(args)
        else:
            for k in load_keys(args.keys):
                print(f"{k.name}\t{k.hint}\t{k.priority}\t{_limits_text(k)}")
            return 0
    except KeyStoreError as exc:
        print(f"everycycle keys: {exc}", file=sys.stderr)
        return 2
    from host_runtime.auth.carried_keys import refresh_carried

    try:
        if refresh_carried(args.keys):
            print("the update waiting for a reboot carries this change too", file=sys.stderr)
    except OSError as exc:
        print(f"everycycle keys: the change is made, but the copy an update waiting for a reboot carries could not "
              f"be taken again ({exc.strerror}): run this as root, or the next slot brings back the old keys",
              file=sys.stderr)
        return 1
    return 0


def _key_limits(args) -> dict:
    def listed(text):
        return None if text is None else tuple(m.strip() for m in text.split(",") if m.strip())

    return {"max_concurrent": args.max_concurrent, "tokens_per_minute": args.tokens_per_minute,
            "tokens_per_day": args.tokens_per_day, "models": listed(args.models),
            "allowed_from": listed(args.allowed_from),
            "may_pull": None if args.may_pull is None else args.may_pull == "yes"}


def _limits_text(k) -> str:
    parts = [f"{k.max_concurrent} at once" if k.max_concurrent else "",
             f"{k.tokens_per_minute:,} tokens/min" if k.tokens_per_minute else "",
             f"{k.tokens_per_day:,} tokens/day" if k.tokens_per_day else "",
             f"models {','.join(k.models)}" if k.models else "",
             f"from {','.join(k.allowed_from)}" if k.allowed_from else "",
             "may pull models" if k.may_pull else ""]
    return ", ".join(p for p in parts if p) or "no limit"


def _keys_usage(args) -> int:
    import json as json_module

    from host_runtime.engine import usage_file

    directory = args.usage_dir or os.environ.get("EVERYCYCLE_USAGE_DIR") or "/var/lib/everycycle/usage"
    usage = usage_file.read_all(directory)
    if args.json:
        print(json_module.dumps(usage, indent=2, sort_keys=True))
        return 0
    if not usage:
        print(f"no usage recorded in {directory}")
        return 0
    print(f"{'KEY':24} {'REQUESTS':>9} {'PROMPT':>12} {'CACHED':>12} {'GENERATED':>12} {'ERRORS':>7}")
    for key, c in sorted(usage.items(), key=lambda kv: -(kv[1].get("key_prompt_tokens_total", 0)
                                                        + kv[1].get("key_generated_tokens_total", 0))):
        print(f"{key:24} {c.get('key_requests_total', 0):9,.0f} {c.get('key_prompt_tokens_total', 0):12,.0f} "
              f"{c.get('key_cached_prompt_tokens_total', 0):12,.0f} {c.get('key_generated_tokens_total', 0):12,.0f} "
              f"{c.get('key_errors_total', 0):7,.0f}")
    return 0


def cmd_fleet(parser, args) -> int:
    import threading

    if args.fleet_command == "status":
        return _fleet_status(args)

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

    from host_runtime.fleet.state import GatewayState, render

    path = Path(args.state) if args.state else _run_dir(args.run_dir) / "fleet" / "fleet.json"
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
    peers = merge_peers(settings.peers, found)
    if args.json:
        print(json_module.dumps({"configured": list(settings.peers), "found_by_mdns": list(found),
                                 "peers": list(peers)}, indent=1))
    else:
        for p in peers:
            print(p + ("  (mDNS)" if p in found and p not in settings.peers else ""))
    return 0


def cmd_models(parser, args) -> int:
    from host_runtime.admin.models_cli import run

    return run(parser, args)


def cmd_update(parser, args) -> int:
    from host_runtime.update.cli import run

    return run(parser, args)


def cmd_measure(parser, args) -> int:
    from host_runtime.measure.cli import run

    return run(parser, args)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _setup_logging()
    if args.command in ("serve", "engine", "plan", "discover"):
        # Before anything imports llama_cpp: which llama.cpp build this process and its engines load.
        from host_runtime.gpu.llama_build import load_first, select

        select()
        if args.command in ("engine", "plan"):  # they load a model: llama.cpp's libraries before numpy's
            load_first()
    handlers = {"serve": cmd_serve, "engine": cmd_engine, "plan": cmd_plan, "keys": cmd_keys, "discover": cmd_discover,
                "governor": cmd_governor, "console": cmd_console, "status": cmd_console, "provision": cmd_provision,
                "bmc": cmd_bmc, "front": cmd_front, "update": cmd_update,
                "models": cmd_models, "fleet": cmd_fleet, "measure": cmd_measure}
    try:
        return handlers[args.command](parser, args)
    except KeyboardInterrupt:
        return 130
    except EveryCycleError as exc:  # one no handler said in its own words: its message, its family's code
        print(f"everycycle {args.command}: {exc}", file=sys.stderr)
        return exit_code(exc)


# The box's error families, mapped once to exit codes (common/errors.py): 2 as argparse's for input that cannot be
# used, 69 (sysexits' EX_UNAVAILABLE) for a part not answering now, 1 for the rest.
EXIT_CODES = ((InputError, 2), (UnavailableError, 69), (EveryCycleError, 1))


def exit_code(exc: EveryCycleError) -> int:
    return next(code for family, code in EXIT_CODES if isinstance(exc, family))


if __name__ == "__main__":
    sys.exit(main())
