"""`everycycle serve`, `engine` and `plan`: the commands that load a model (and the engine pool serve runs)."""

from __future__ import annotations

import argparse
from dataclasses import replace
import logging
import os
import sys
import tempfile
from pathlib import Path

from host_runtime.cli.options import ENGINE_SETTINGS, SERVE_SETTINGS, serving_tunable
from host_runtime.common import run_layout
from host_runtime.common.file_lock import InUse, hold

SERVE_LOCK = "serve.lock"  # in the run folder: the serve that owns it (its pid), held while it runs


def _resolve_model(parser: argparse.ArgumentParser, model: str | None) -> str:
    from host_runtime.engine.model import ModelLoadError, check_gguf_file, default_model_path

    from host_runtime.placement.whisper_file import is_whisper

    if model and is_whisper(model):
        parser.error(f"--model: {model} is a Whisper model (speech to text): add it to the store (everycycle models "
                     "add PATH) and name it in /v1/audio/transcriptions; --model takes a text model's GGUF")
    try:
        path = Path(model) if model else default_model_path()
        return str(check_gguf_file(path).resolve())
    except ModelLoadError as exc:
        parser.error(f"--model: {exc}")


def _resolve_draft_model(parser: argparse.ArgumentParser, args) -> str | None:
    """--draft-model goes with --speculation draft, each needing the other; the path is checked as --model's."""
    if args.speculation == "draft" and not args.draft_model:
        parser.error("--speculation draft: needs --draft-model PATH, the GGUF that drafts")
    if args.draft_model and args.speculation != "draft":
        parser.error("--draft-model: drafts only with --speculation draft")
    if args.draft_p_min and args.speculation != "draft":
        parser.error("--draft-p-min: applies only to --speculation draft (a draft model's probabilities)")
    return _resolve_gguf(parser, "--draft-model", args.draft_model)


def _store_projector(args, model_path: str) -> str | None:
    """The projector the store keeps beside a store model (models add --mmproj); None for any other file."""
    from host_runtime.models.errors import StoreError

    try:
        return _model_store(args).projector_of(model_path) if hasattr(args, "model_store") else None  # serve's
    except StoreError:
        return None  # an unreadable manifest: the model is refused when loaded, with the reason


def _resolve_gguf(parser: argparse.ArgumentParser, option: str, path: str | None) -> str | None:
    """An optional GGUF file's path, checked as --model's."""
    from host_runtime.engine.model import ModelLoadError, check_gguf_file

    if not path:
        return None
    try:
        return str(check_gguf_file(path).resolve())
    except ModelLoadError as exc:
        parser.error(f"{option}: {exc}")


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
    if not (args.gpu_layers or args.tensor_split or args.main_gpu is not None) or args.shard_host:
        return  # with shard hosts, their devices take the layers: the engine's proof checks them once reached
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
    from host_runtime.common.run_layout import fleet_state_file
    from host_runtime.engine.key_ledger_file import LEDGER_NAME
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
        try:
            # Two serves on one run folder bind the same engine socket: one's workers then talk to the other's
            # engine, and when either stops the other loses its engine (seen: an orphaned engine left spinning).
            owned = hold(run_dir / SERVE_LOCK, f"--run-dir {run_dir}")  # noqa: F841 - held while serve runs
        except InUse as exc:
            parser.error(f"{exc}: give each serve its own --run-dir")
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
                       max_media_body_bytes=args.max_media_body_bytes,
                       ready_wait_s=args.ready_wait, wedge_floor_s=args.wedge_floor, metrics_access=metrics_access,
                       governor_state=args.governor_state, pool_socket=pool.control_socket if pool else None,
                       fleet_router=args.fleet_router or settings.fleet_router or None,
                       prefix_cache_shared=args.prefix_cache_shared or settings.prefix_cache_shared,
                       aliases=tuple(settings.aliases.items()),
                       model_store=str(pool.store.root) if pool else None,
                       pull_hosts=tuple(settings.pull_hosts),
                       trace_endpoint=args.trace_endpoint or settings.trace_endpoint or None,
                       trace_sample_ratio=settings.trace_sample_ratio,
                       key_ledger=os.path.join(args.usage_dir, LEDGER_NAME) if args.usage_dir else None,
                       # on the gateway: the fleet's use of each vouched key, which its vouchers carry
                       fleet_state=(args.fleet_state or str(fleet_state_file(run_layout.run_dir())))
                       if (args.fleet_router or settings.fleet_router) else None)
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
    from host_runtime.pool.residency import parse_keep_alive

    resolved = argparse.Namespace(**vars(args))
    flagged = [serving_tunable(name) for name in ENGINE_SETTINGS + SERVE_SETTINGS]
    resolved.explicit = frozenset(t.dest for t in flagged if getattr(args, t.dest) is not None)
    own = own or {}
    for t in flagged:
        if getattr(args, t.dest) is None:  # each setting's default is said once, where it is declared
            setattr(resolved, t.dest, own.get(t.dest) or getattr(settings, t.name) or t.default)
    resolved.keep_alive = parse_keep_alive(resolved.keep_alive)  # in seconds; None: forever
    resolved.usage_dir = args.usage_dir or settings.usage_dir or None
    _settings_shards(resolved, args, settings)
    return resolved


def _settings_shards(resolved, args, settings) -> None:
    """serving.toml's shard hosts (box.toml's [fleet] shard_hosts) and the file of their wire keys provisioning
    wrote, where the command line named no --shard-host."""
    if not args.shard_host:
        resolved.shard_host = list(settings.shard_hosts) or None
        resolved.shard_key_file = args.shard_key_file or settings.shard_key_file or None


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

        on_demand = replace(options.for_on_demand(path), mmproj=_store_projector(args, path))
        try:
            own = store.own_serve_options(path)
        except StoreError as exc:
            logging.getLogger("everycycle.serve").warning("%s: loaded with box.toml's settings", exc)
            own = {}
        own = {option: value for option, value in own.items() if option not in getattr(args, "explicit", ())}
        return on_demand.with_serving(**own) if own else on_demand

    def need_for(path: str) -> int:
        from host_runtime.placement.projector_file import projector_bytes
        from host_runtime.placement.session import resident_bytes_for

        wanted = options_for(path)
        return resident_bytes_for(path, wanted.context) + cache_ram + projector_bytes(wanted.mmproj)
    return EnginePool(run_dir=run_dir, default_name=model_id_for(options.model), default_path=options.model,
                      default_socket=socket_path, default_child=engine, engine_options=options_for,
                      store=store, budget_bytes=budget, need_for=need_for, keep_alive_s=args.keep_alive)


def _given(**values) -> dict:
    """The settings the command line gave (None: not given, the settings class's own default stands)."""
    return {name: value for name, value in values.items() if value is not None}


def _mib(mib: int | None) -> int | None:
    return None if mib is None else mib << 20


def engine_options(parser, args, model: str | None):
    """The engine's settings from `serve`'s or `engine`'s options (checked first, the model last), as one
    EngineOptions."""
    from host_runtime.engine.model import ContextConfig, model_id_for
    from host_runtime.engine.options import EngineOptions, PrefixCacheConfig
    from host_runtime.engine.readiness import WedgePolicy
    from host_runtime.engine.speculation import SpeculationConfig

    _check_offload_flags(parser, args)
    speculating = args.speculation not in (None, "off")
    context = ContextConfig(**_given(n_ctx_per_seq=args.ctx_size, kv_budget_bytes=_mib(args.kv_budget_mib),
                                     cache_type_k=args.cache_type_k, cache_type_v=args.cache_type_v),
                            n_parallel=args.parallel, n_threads=args.threads, n_threads_decode=args.decode_threads,
                            max_waiting=args.max_queue,
                            placement=args.placement, n_gpu_layers=args.gpu_layers,
                            tensor_split=_split_values(args.tensor_split), gpu_margin_bytes=args.gpu_margin_mib << 20,
                            main_gpu=args.main_gpu, speculation=speculating,
                            # Across boxes, mixed batches: a stream per sequence (the invariant mode's) costs a
                            # network exchange per stream each step (bench/shard.py: 0.41x llama-server --rpc's
                            # tok/s at 4 sequences invariant, 0.94x mixed)
                            batch_invariant=not (args.mixed_batches or args.shard_host),
                            n_cpu_moe=_n_cpu_moe(args),
                            host_ram_bytes=_mib(getattr(args, "models_memory_mib", 0) or None))  # serve's
    cache = PrefixCacheConfig(enabled=not args.no_prefix_cache, ram_bytes=args.prefix_cache_ram_mib << 20,
                              disk_bytes=args.prefix_cache_disk_mib << 20, directory=args.prefix_cache_dir)
    speculation = SpeculationConfig(enabled=speculating, kind="ngram" if not speculating else args.speculation,
                                    k_max=args.draft_max, cost_aware=not args.draft_always, p_min=args.draft_p_min)
    draft_model = _resolve_draft_model(parser, args)
    model_path = _resolve_model(parser, model)
    usage_dir = getattr(args, "usage_dir", None)  # serve's (engine runs without)
    return EngineOptions(shards=_shard_config(parser, args), model=model_path, context=context, prefix_cache=cache,
                         speculation=speculation, draft_model=draft_model, governor_state=args.governor_state,
                         wedge=WedgePolicy(floor_s=args.wedge_floor),
                         usage_file=os.path.join(usage_dir, f"{model_id_for(model_path)}.json") if usage_dir else None,
                         mmproj=_resolve_gguf(parser, "--mmproj", args.mmproj) or _store_projector(args, model_path))


def cmd_engine(parser, args) -> int:
    _refuse_an_unsupported_cpu(parser)
    import json

    from host_runtime.placement.whisper_file import is_whisper

    raw = sys.stdin.buffer.read() if args.options_stdin else None
    try:  # the model's kind first, from the settings' JSON as it is (pydantic's reader below imports numpy)
        model = json.loads(raw).get("model") if raw is not None else args.model
    except (ValueError, AttributeError):
        model = None
    speech = isinstance(model, str) and is_whisper(model)
    if not speech:
        from host_runtime.gpu.llama_build import load_first

        load_first()  # llama.cpp's libraries before numpy's (gpu/llama_build.py says why)
    from host_runtime.engine.options import EngineOptions, OptionsError

    if raw is not None:
        try:
            options = EngineOptions.from_json(raw)
        except OptionsError as exc:
            parser.error(f"--options-stdin: {exc}")
    else:
        options = engine_options(parser, args, args.model)
    if speech:  # a speech model: whisper.cpp's process, llama.cpp never loaded in it
        from host_runtime.engine.ipc_server import serve_socket
        from host_runtime.speech.service import SpeechHandler, SpeechService

        service = SpeechService(options)
        serve_socket(args.socket, service, SpeechHandler)
        return 0 if service.state != "failed" else 1
    from host_runtime.engine.service import EngineService, serve_engine

    engine = EngineService(options)
    serve_engine(args.socket, engine)
    return 0 if engine.state != "failed" else 1


def _shard_config(parser, args):
    """--shard-host and --shard-key-file (or serving.toml's shard_hosts and shard_key_file) as the engine's
    ShardConfig, the key file checked now (its path, its permissions, a key for every host), not at the load."""
    from host_runtime.shard.holder import ShardConfig

    if not args.shard_host:
        if args.shard_key_file:
            parser.error("--shard-key-file goes with --shard-host")
        return ShardConfig()
    if args.placement == "cpu":
        parser.error("--shard-host lends devices to place layers on: not with --placement cpu")
    if not args.shard_key_file:
        parser.error("--shard-host needs --shard-key-file: the wire to the shard hosts is keyed from the fleet key")
    if len(set(args.shard_host)) != len(args.shard_host):
        parser.error(f"--shard-host: {', '.join(args.shard_host)} names a box twice")
    from host_runtime.auth.keystore import KeyStoreError, check_permissions
    from host_runtime.shard.errors import ShardError
    from host_runtime.shard.holder import read_secrets

    try:
        check_permissions(args.shard_key_file)  # the rule every key file of the box has
        read_secrets(args.shard_key_file, list(args.shard_host))
    except OSError as exc:
        parser.error(f"--shard-key-file: cannot read {args.shard_key_file}: {exc.strerror}")
    except (KeyStoreError, ShardError) as exc:
        parser.error(f"--shard-key-file: {exc}")
    return ShardConfig(hosts=tuple(args.shard_host), key_file=os.path.abspath(args.shard_key_file))


def _n_cpu_moe(args) -> int | None:
    """--cpu-moe is every layer: a count past any model's layers, which the planner clips to the model's."""
    return 1 << 16 if args.cpu_moe else args.n_cpu_moe


def _split_values(text: str | None) -> tuple[float, ...] | None:
    return tuple(float(x) for x in text.split(",")) if text else None


def _fleet_plan_arguments(parser, args):
    """plan's options with serving.toml's shard hosts, their keys and the models' budget where none were given:
    the split this box's serving would load."""
    from host_runtime.common.settings_file import SettingsError, load
    from host_runtime.serving.settings import ServingSettings

    path = args.settings or str(run_layout.serving_settings_file())
    if not os.path.exists(path):
        parser.error(f"plan --fleet: {path}: no such settings file (name one with --settings)")
    try:
        settings = load(ServingSettings, path)
    except SettingsError as exc:
        parser.error(f"plan --fleet: {path}: {exc}")
    if not (args.shard_host or settings.shard_hosts):
        parser.error(f"plan --fleet: {path} names no shard hosts (box.toml's [fleet] shard_hosts) and no "
                     "--shard-host was given")
    resolved = argparse.Namespace(**vars(args))
    _settings_shards(resolved, args, settings)
    resolved.models_memory_mib = args.models_memory_mib or settings.models_memory_mib or None
    return resolved


def cmd_plan(parser, args) -> int:
    import json

    from host_runtime.placement.render import render_table
    from host_runtime.engine.model import ContextConfig
    from host_runtime.placement.projector_file import projector_device, with_projector_room
    from host_runtime.placement.session import PlanInputsError, plan_for_cli

    _refuse_offload_with_cpu_placement(parser, args)
    if args.fleet:
        args = _fleet_plan_arguments(parser, args)
    elif args.settings:
        parser.error("plan: --settings goes with --fleet")
    shard_config = _shard_config(parser, args)
    if shard_config.hosts and args.topology:
        parser.error("--shard-host: the members' devices are asked live; not with --topology")
    model = _resolve_model(parser, args.model)
    projector = _read_projector(parser, args.mmproj)
    config = ContextConfig(
        **_given(n_ctx_per_seq=args.ctx_size, kv_budget_bytes=_mib(args.kv_budget_mib),
                 cache_type_k=args.cache_type_k, cache_type_v=args.cache_type_v),
        n_parallel=args.parallel, placement=args.placement, n_gpu_layers=args.gpu_layers,
        tensor_split=_split_values(args.tensor_split),
        gpu_margin_bytes=args.gpu_margin_mib << 20, main_gpu=args.main_gpu, n_cpu_moe=_n_cpu_moe(args),
        host_ram_bytes=_mib(args.models_memory_mib or None))
    shards = None
    try:
        if shard_config.hosts:  # their devices join this process's before the plan, as in the engine
            from host_runtime.shard.holder import Shards

            shards = Shards(shard_config)
            shards.attach()
        outcome = plan_for_cli(model, with_projector_room(config, projector), n_batch=args.batch,
                               topology=args.topology)
    except PlanInputsError as exc:
        print(f"everycycle plan: {exc}", file=sys.stderr)
        return 2
    finally:
        if shards is not None:
            shards.stop()
    if outcome.error:
        if args.json:
            print(json.dumps({"fits": False, "reason": outcome.error, "proven": outcome.proven}, indent=2))
        print(f"everycycle plan: {outcome.error}", file=sys.stderr)
        return 1
    placed = projector_device(outcome.placement, projector) if projector else None
    if projector and placed is None:
        reason = (f"the projector needs {projector.total_bytes / 2**20:.0f} MiB beside the model in host RAM, "
                  f"which has {outcome.placement.cpu_share.capacity_bytes / 2**20:.0f} MiB for the plan")
        if args.json:
            print(json.dumps({"fits": False, "reason": reason, "proven": outcome.proven}, indent=2))
        print(f"everycycle plan: {reason}", file=sys.stderr)
        return 1
    if args.json:
        extra = {"projector": {**projector.to_json(), "device": placed}} if projector else {}
        print(json.dumps({"fits": True, "proven": outcome.proven, "proof": outcome.proof_note,
                          **outcome.placement.to_json(), **extra}, indent=2))
    else:
        print(render_table(outcome.placement, proven=outcome.proven, proof_note=outcome.proof_note))
        if projector:
            print(f"projector ({projector.takes}) on {placed}: {projector.weights_bytes / 2**20:.0f} MiB weights + "
                  f"{projector.compute_bytes / 2**20:.0f} MiB encoder compute (estimated: one input at its largest, "
                  f"{projector.positions} positions)")
    return 0


def _read_projector(parser, path: str | None):
    if not path:
        return None
    from host_runtime.placement.projector_file import read_projector

    checked = _resolve_gguf(parser, "--mmproj", path)
    try:
        return read_projector(checked)
    except ValueError as exc:
        parser.error(f"--mmproj: {path}: {exc}")
