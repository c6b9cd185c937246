"""`everycycle models list | show | add | pull | rm | pin`: the command line over the store."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from host_runtime.models import pull as pulling
from host_runtime.models.errors import StoreError
from host_runtime.models.store import Store


def add_parser(sub) -> None:
    models = sub.add_parser("models", help="the model store: list, add, pull, remove and pin models",
                            description="Models kept on the box's data partition ($EVERYCYCLE_MODEL_STORE, else "
                                        "/var/lib/everycycle/models).")
    models.add_argument("--store", type=Path, metavar="DIR", help="the store's directory (default: as above)")
    m_sub = models.add_subparsers(dest="models_command", metavar="ACTION", required=True)
    listing = m_sub.add_parser("list", help="every model in the store")
    show = m_sub.add_parser("show", help="one model's manifest")
    show.add_argument("name", metavar="NAME")
    add = m_sub.add_parser("add", help="copy a GGUF file on this machine into the store")
    add.add_argument("file", type=Path, metavar="FILE")
    pull = m_sub.add_parser("pull", help="download a model: an http(s) URL on the LAN, or hf://OWNER/REPO/FILE.gguf")
    pull.add_argument("source", metavar="SOURCE")
    for p in (add, pull):
        p.add_argument("--name", metavar="NAME", help="the model's name (default: the file's name without .gguf)")
        p.add_argument("--sha256", metavar="HEX", help="refuse the file unless its sha256 is this")
    rm = m_sub.add_parser("rm", help="remove a model")
    rm.add_argument("name", metavar="NAME")
    rm.add_argument("--force", action="store_true", help="remove it even when pinned or being served")
    pin = m_sub.add_parser("pin", help="keep a model loaded and protected from rm (--off to undo)")
    pin.add_argument("name", metavar="NAME")
    pin.add_argument("--off", action="store_true", help="unpin")
    for p in (listing, show, add, pull, pin):
        p.add_argument("--json", action="store_true", help="print JSON")


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def run(parser: argparse.ArgumentParser, args) -> int:
    store = Store(args.store)
    try:
        return _run(args, store)
    except StoreError as exc:
        print(f"everycycle models {args.models_command}: {exc}", file=sys.stderr)
        return 1


def _print(manifest, as_json: bool) -> None:
    print(json.dumps(asdict(manifest), indent=2) if as_json else
          f"{manifest.name}: {manifest.size / 2**20:,.1f} MiB, {manifest.architecture} {manifest.quantization}, "
          f"context {manifest.context_length}{', pinned' if manifest.pinned else ''}")


def _run(args, store: Store) -> int:
    command = args.models_command
    if command == "list":
        models = store.list()
        if args.json:
            print(json.dumps([asdict(m) for m in models], indent=2))
        elif not models:
            print(f"no models in {store.root} (everycycle models pull SOURCE, or add FILE)")
        else:
            print(f"{'NAME':32} {'SIZE':>10} {'ARCH':10} {'QUANT':8} {'CONTEXT':>8}  {'KIND':16} PINNED")
            for m in models:
                kind = f"embedding ({m.pooling})" if m.pooling else "chat"
                print(f"{m.name:32} {m.size / 2**20:9,.1f}M {m.architecture:10} {m.quantization:8} "
                      f"{m.context_length:>8}  {kind:16} {'yes' if m.pinned else ''}")
        return 0
    if command == "show":
        manifest = store.get(args.name)
        print(json.dumps({**asdict(manifest), "path": str(store.path_of(manifest))}, indent=2) if args.json
              else "\n".join(f"{k:15} {v}" for k, v in {**asdict(manifest), "path": store.path_of(manifest)}.items()))
        return 0
    if command == "add":
        _print(pulling.add(store, args.file, args.name, args.sha256, _say), args.json)
        return 0
    if command == "pull":
        _print(pulling.pull(store, args.source, args.name, args.sha256, _say), args.json)
        return 0
    if command == "rm":
        manifest = store.get(args.name)
        if manifest.pinned and not args.force:
            raise StoreError(f"{args.name} is pinned: unpin it first (everycycle models pin --off {args.name}), or "
                             "--force")
        loaded = _loaded_models()
        if args.name in loaded:
            if not args.force:
                raise StoreError(f"{args.name} is loaded and being served: --force unloads it first")
            _unload(args.name)
        store.remove(args.name)
        print(f"removed {args.name}")
        return 0
    if command == "pin":
        _print(store.set_pinned(args.name, not args.off), args.json)
        return 0
    raise AssertionError(command)


def _pool():
    """The serving service's engine pool (its control socket), which knows what is loaded."""
    import os

    from host_runtime.pool.protocol import PoolClient

    run_dir = Path(os.environ.get("EVERYCYCLE_RUN_DIR", "/run/everycycle"))
    return PoolClient(str(run_dir / "serving" / "models.sock"))


def _loaded_models() -> set[str]:
    """The models with an engine now; none when the serving service is not running."""
    from host_runtime.engine.ipc import EngineUnavailable

    try:
        rows = _pool().models()
    except (EngineUnavailable, OSError):
        return set()
    return {r.id for r in rows if r.state in ("loaded", "loading")}


def _unload(name: str) -> None:
    from host_runtime.engine.errors import RequestRejected
    from host_runtime.engine.ipc import EngineUnavailable

    try:
        _pool().unload(name)
    except (EngineUnavailable, OSError) as exc:
        raise StoreError(f"could not ask the serving service to unload {name}: {exc}") from None
    except RequestRejected as exc:
        raise StoreError(exc.message) from None
    _say(f"unloaded {name}")
